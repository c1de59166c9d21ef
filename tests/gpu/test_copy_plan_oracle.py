"""The jitted copy planner equals the old numpy planner (tests/gpu/plan_oracle.py) on random
batches, valid or not: the same runs and segments, or the same typed error and message, and
a refused batch copies nothing. (Its own module: the GPU machine's image may lack
Hypothesis, and the rest of tests/gpu must still run there.)"""

import numpy as np
import pytest
import torch

from kvpool.errors import KvPoolError
from kvpool.gpu import BlockCopier, PagedKVCache
from kvpool.gpu.copy_plan import CopyPlanner

from . import plan_oracle as oracle
from .test_copy_plan import BLOCKS, CONFIG, SIDES

hypothesis = pytest.importorskip("hypothesis")
given, settings, st = hypothesis.given, hypothesis.settings, hypothesis.strategies


ids = st.integers(-2, BLOCKS + 1)
entry = st.one_of(
    st.tuples(ids, ids, st.integers(-1, 3)),
    st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2)),  # runs, collisions
    st.sampled_from([(True, 5, 0), ("2", 6, 0), (1.5, 2, 0), (1, 5), 7]),  # malformed
)


def outcome(fn):
    try:
        return "ok", fn()
    except KvPoolError as error:
        return type(error), str(error)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(entry, max_size=9),
       side=st.sampled_from(sorted(SIDES)),
       counts=st.dictionaries(st.integers(0, BLOCKS - 1), st.integers(0, 3)),
       retained=st.lists(st.integers(-1, BLOCKS), max_size=4),
       with_refs=st.booleans(), malformed=st.booleans())
def test_the_jitted_plan_is_the_numpy_plan(rows, side, counts, retained, with_refs,
                                           malformed) -> None:
    if not malformed:
        rows = [r for r in rows if isinstance(r, tuple) and len(r) == 3 and
                all(type(x) is int for x in r)]
    src, dst, same_space, null_dst = SIDES[side]
    refs = (lambda dsts: [counts.get(b, 1) for b in dsts]) if with_refs else None

    def old():
        arr = oracle.as_pair_array(rows)
        oracle.check_batch(arr, len(CONFIG.kv_cache_groups), src.num_blocks, dst.num_blocks,
                           same_space=same_space, ref_cnts=refs, retained=retained,
                           null_dst=null_dst)
        runs = oracle.coalesce(arr)
        return len(runs), oracle.segments(runs, src, dst).tolist()

    planner = CopyPlanner(src, dst, same_space=same_space, null_dst=null_dst)

    def new():
        plan = planner.plan(rows, ref_cnts=refs, retained=retained)
        return plan.runs, plan.segments.tolist()

    assert outcome(new) == outcome(old)
    assert not planner._marks.any()
    if with_refs:  # the same counts as an array by block id: the same outcome
        by_block = np.array([counts.get(b, 1) for b in range(dst.num_blocks)])
        assert outcome(lambda: (lambda p: (p.runs, p.segments.tolist()))(
            planner.plan(rows, ref_cnts=by_block, retained=retained))) == outcome(old)


@settings(max_examples=100, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(1, BLOCKS - 1), st.integers(1, BLOCKS - 1),
                                st.integers(0, 2)), max_size=10, unique_by=lambda p: p[1]),
       dtype=st.sampled_from([torch.float16, torch.float32, torch.uint8]))
def test_a_batch_copies_exactly_what_the_numpy_plan_says_or_nothing(pairs, dtype) -> None:
    cache = PagedKVCache(CONFIG, dtype, num_layers=2)
    cache.flat.copy_(torch.arange(cache.flat.numel()).to(dtype))
    before = cache.words().numpy().copy()
    try:
        arr = oracle.as_pair_array(pairs)
        oracle.check_batch(arr, 3, BLOCKS, BLOCKS, same_space=True)
        want = before.copy()
        for s, d, n in oracle.segments(oracle.coalesce(arr), cache, cache).tolist():
            want[d:d + n] = before[s:s + n]
    except KvPoolError as error:
        with pytest.raises(type(error)):
            BlockCopier(cache).copy(pairs)
        want = before
    else:
        BlockCopier(cache).copy(pairs)
    assert (cache.words().numpy() == want).all()
