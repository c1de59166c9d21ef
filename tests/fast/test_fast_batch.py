"""The fast batch verbs equal their generic compositions in :mod:`kvpool.batch`.

``find_longest_cache_hit`` and ``allocate_and_cache`` of the fast pool (one kernel call) are
compared with the generic functions run on a spec pool and on a fast pool: same results,
same state, same events, same watcher and metrics calls; errors of the same type, and
neither the fast verb nor the composition changes anything when it raises. (The verbs of a
scheduler step and of an admission: ``test_fast_batch_verbs``.)
"""

from __future__ import annotations

import numpy as np
import pytest
from fast_twin import assert_sound, block_hash, fast_pool, request_with_hashes

from kvpool import batch, make_pool
from kvpool.errors import (
    CachingDisabled,
    HashStateError,
    InvalidArgument,
    InvalidBlockId,
    InvalidGroupId,
    KvPoolError,
    NoFreeBlocks,
)


def three_pools(n=16, **options):
    """spec (generic verbs), fast (generic verbs), fast (its own verbs)."""
    return [make_pool(n, backend="spec", **options), fast_pool(n, jit=True, **options),
            fast_pool(n, jit=True, **options)]


def seeded(pools, request, groups=(0, 1)):
    """Cache the first 5 hashes of ``request`` in every group, then free (cached, reusable)."""
    for pool in pools:
        for g in groups:
            blocks = pool.get_new_blocks(5)
            pool.cache_full_blocks(request, blocks, 0, 5, 16, g)
            pool.free_blocks(blocks[::-1])


@pytest.mark.parametrize("as_array", [False, True])
def test_longest_hit_stops_at_the_first_position_any_group_misses(as_array):
    pools = three_pools()
    r = request_with_hashes(8)
    seeded(pools, r)
    spec, fast_generic, fast = pools
    extra = fast.get_new_blocks(1)
    fast.cache_full_blocks(r, [0, 0, 0, 0, 0, extra[0]], 5, 6, 16, 0)  # position 5, group 0 only
    for pool in (spec, fast_generic):
        (b,) = pool.get_new_blocks(1)
        pool.cache_full_blocks(r, [0, 0, 0, 0, 0, b], 5, 6, 16, 0)
    hashes = np.frombuffer(b"".join(r.block_hashes), np.uint8).reshape(8, 32) if as_array \
        else r.block_hashes
    for groups, limit, length in [([0, 1], None, 5), ([0], None, 6), ([1, 0], 3, 3),
                                  ([1], 0, 0), ([0, 2], None, 0)]:
        got = fast.find_longest_cache_hit(hashes, groups, limit)
        assert got == batch.find_longest_cache_hit(spec, hashes, groups, limit)
        assert got == batch.find_longest_cache_hit(fast_generic, hashes, groups, limit)
        assert [len(x) for x in got] == [length] * len(groups)
    assert fast.find_longest_cache_hit([], [0]) == [[]]
    for bad, error in [(([b"x"], []), InvalidArgument), ((["x"], [0]), InvalidArgument),
                       (([b"x"], [2**32]), InvalidGroupId), (([b"x"], [0], -1), InvalidArgument),
                       ((np.zeros((2, 3), np.int8), [0]), InvalidArgument)]:
        with pytest.raises(error):
            fast.find_longest_cache_hit(*bad)
        with pytest.raises(error):
            batch.find_longest_cache_hit(spec, *bad)


@pytest.mark.parametrize("events", [False, True])
def test_allocate_and_cache_equals_allocation_then_caching(events):
    pools = three_pools(20, enable_kv_cache_events=events)
    r = request_with_hashes(8)
    seeded(pools, r, groups=(0,))  # cached candidates at the tail: allocation evicts some
    results = []
    for i, pool in enumerate(pools):
        hit = pool.get_cached_block(r.block_hashes[0], [0])
        pool.touch(hit)
        verb = pool.allocate_and_cache if i == 2 else (
            lambda *a, p=pool: batch.allocate_and_cache(p, *a))
        new = verb(r, hit, 13, 1, 8, 16, 0)
        more = verb(r, hit + new, 1, 8, 8, 16, 0, None)  # nothing left to cache
        masked = verb(r, [], 2, 0, 2, 32, 3, [True, False])  # coarse hashes, a mask
        results.append((new, more, masked, pool.take_events()))
    assert results[0] == results[1] == results[2]
    assert pools[0].abstract() == pools[1].abstract() == pools[2].abstract()
    assert len(results[0][0]) == 13
    assert_sound(pools[2])


def test_allocate_and_cache_errors_change_nothing_in_the_fast_pool():
    pools = three_pools()
    r = request_with_hashes(4)
    spec, _, fast = pools
    held = {}
    for pool in (spec, fast):
        held[id(pool)] = pool.get_new_blocks(2)
        pool.cache_full_blocks(r, held[id(pool)], 0, 2, 16, 0)
    cases = [
        ((r, [], -1, 0, 1, 16, 0), InvalidArgument),
        ((r, [], 99, 0, 1, 16, 0), NoFreeBlocks),
        ((r, [], 1, 0, 1, 16, -1), InvalidGroupId),
        ((r, [], 1, 0, 2, 16, 0), InvalidArgument),  # table too short
        ((r, [], 5, 0, 5, 16, 0), InvalidArgument),  # hashes too short
        ((r, [], 1, 0, 1, 16, 0, [True, True]), InvalidArgument),  # mask length
        ((r, ["x"], 1, 0, 2, 16, 0), InvalidBlockId),
        ((r, [99], 1, 0, 2, 16, 0), InvalidBlockId),
        ("held", 1, 0, 3, 16, 0),  # position 0 already carries that key
        ("free", 1, 0, 2, 16, 0),  # the table names a free block
    ]
    for case in cases:
        args, error = (case if case[0] not in ("held", "free") else (case, HashStateError))
        for pool in (spec, fast):
            if args[0] == "held":
                call_args = (r, held[id(pool)], *args[1:])
            elif args[0] == "free":
                call_args = (r, [pool.abstract().state.free_queue[-1]], *args[1:])
            else:
                call_args = args
            before = pool.abstract()
            with pytest.raises(error):
                if pool is fast:
                    fast.allocate_and_cache(*call_args)
                else:
                    batch.allocate_and_cache(spec, *call_args)
            assert pool.abstract() == before  # the composition validates up front too
            if pool is fast:
                assert_sound(fast)
    caching_off = fast_pool(4, jit=True, enable_caching=False)
    with pytest.raises(CachingDisabled):
        caching_off.allocate_and_cache(r, [], 1, 0, 1, 16, 0)
    assert caching_off.get_num_free_blocks() == 3


def test_allocate_and_cache_fires_watchers_and_metrics_like_the_composition():
    calls = {0: [], 1: []}

    class Recorder:
        def __init__(self, key):
            self.key = key

        def __getattr__(self, name):
            return lambda *a: calls[self.key].append((name, *a))

    pools = [make_pool(8, backend="spec", metrics_collector=Recorder(0)),
             fast_pool(8, jit=True, metrics_collector=Recorder(1))]
    r = request_with_hashes(3)
    for i, pool in enumerate(pools):
        (b,) = pool.get_new_blocks(1)
        pool.unpin_blocks([b], lambda blk, i=i: calls[i].append(("watcher", blk)))
        pool.get_new_blocks(6)  # the unpinned block is next
        if i == 0:
            new = batch.allocate_and_cache(pool, r, [], 1, 0, 1, 16, 0)
        else:
            new = pool.allocate_and_cache(r, [], 1, 0, 1, 16, 0)
        assert new == [b]
    assert calls[0] == calls[1] and ("watcher", 1) in calls[0]
    assert pools[0].abstract() == pools[1].abstract()


def test_batch_verbs_accept_numpy_inputs_and_keep_keys_exact():
    pool = fast_pool(8, jit=False)
    r = request_with_hashes(3)
    new = pool.allocate_and_cache(r, np.array([], dtype=np.int64), np.int64(3), 0, 3, 16, 5)
    assert pool.find_longest_cache_hit(r.block_hashes, [5]) == [new]
    assert pool.find_longest_cache_hit([block_hash("r:0")], [4]) == [[]]
    with pytest.raises(KvPoolError):
        pool.allocate_and_cache(r, np.array([1.0]), 1, 0, 2, 16, 5)
