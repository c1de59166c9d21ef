"""``cached_run_from_end``: the rightmost run of hits of a given length whose end may end a
run (a sliding window's lookup). The composition in :mod:`kvpool.batch` is the definition,
checked here against the plain statement of what it returns; the fast pool's one kernel
call must give the same result and the same error (type and message) for every call, and
change nothing; the sliding-window manager makes one such call per lookup."""

from __future__ import annotations

import itertools

import pytest
from test_fast_range_lookup import cached_pool, outcome, shapes

from kvpool import batch
from kvpool.errors import KvPoolError
from kvpool.hash_list import BlockHashList


def stated(pool, hashes, groups, stop, run_length, end_every, end_shift):
    """What the verb returns, stated: the greatest p < stop that may end a run with the
    run_length positions up to it all hit, else the longest hit prefix that may end one."""
    hit = [pool.get_cached_block(h, groups) for h in hashes[:stop]]

    def may_end(p):
        return (p + 1 - end_shift) % end_every == 0

    for p in range(stop - 1, run_length - 2, -1):
        first = p - run_length + 1
        if may_end(p) and all(hit[i] is not None for i in range(first, p + 1)):
            return first, [[hit[i][j] for i in range(first, p + 1)] for j in range(len(groups))]
    prefix = 0
    while prefix < stop and hit[prefix] is not None:
        prefix += 1
    end = max((p + 1 for p in range(prefix) if may_end(p)), default=0)
    return 0, [[hit[i][j] for i in range(end)] for j in range(len(groups))]


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_the_run_is_what_the_statement_says(backend) -> None:
    pool, hashes = cached_pool(backend)  # misses at 3 and 7 in group 0; group 1 has 0-4
    before = pool.abstract()
    own = getattr(pool, "cached_run_from_end", None)
    packed = BlockHashList(hashes)
    packed.pack()
    for groups, stop, run_length, every, shift in itertools.product(
            ([0], [1], [0, 1], [1, 0]), range(11), (1, 2, 3, 5), (1, 2, 3), (0, 1)):
        expected = stated(pool, hashes, groups, stop, run_length, every, shift)
        assert batch.cached_run_from_end(pool, hashes, groups, stop, run_length, every,
                                         shift) == expected
        if own is not None:
            for shape in (hashes, packed):
                assert own(shape, groups, stop, run_length, every, shift) == expected, (
                    groups, stop, run_length, every, shift)
    assert pool.abstract() == before  # pure


BAD_ARGUMENTS = [(10, 2, 1, 0), (0, 1, 1, 0), (11, 1, 1, 0), (-1, 1, 1, 0), (5, 0, 1, 0),
                 (5, 1, 0, 0), (5, 1, 1, -1), (5.0, 1, 1, 0), (5, True, 1, 0), (5, 2, 2, 1),
                 (None, 1, 1, 0), (5, 1, 2.0, 0), (2**63, 1, 1, 0)]


@pytest.mark.parametrize("shape", list(shapes([b"x"] * 10)))
@pytest.mark.parametrize("groups", [[0], (0,), [0, 1], [-1], [], [True], [2**32], (0.0,)])
@pytest.mark.parametrize("arguments", BAD_ARGUMENTS)
def test_the_kernel_answers_as_the_composition_and_refuses_as_it(shape, groups,
                                                                 arguments) -> None:
    pool, hashes = cached_pool("fast")
    hashes = shapes(hashes)[shape]
    before = pool.abstract()
    fast = outcome(lambda: pool.cached_run_from_end(hashes, groups, *arguments))
    generic = outcome(lambda: batch.cached_run_from_end(pool, hashes, groups, *arguments))
    assert fast == generic
    assert pool.abstract() == before


def test_errors_name_the_argument() -> None:
    pool, hashes = cached_pool("fast")
    with pytest.raises(KvPoolError, match="run_length must be an int >= 1"):
        pool.cached_run_from_end(hashes, [0], 5, 0)
    with pytest.raises(KvPoolError, match="end_shift must be an int >= 0"):
        pool.cached_run_from_end(hashes, [0], 5, 1, 1, -1)
    with pytest.raises(KvPoolError, match="not a range of the 10 block hashes"):
        pool.cached_run_from_end(hashes, [0], 11, 1)


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_the_sliding_window_lookup_is_one_pool_call(backend) -> None:
    from kvpool.policy.sliding_window import SlidingWindowManager
    from kvpool.policy.specs import SlidingWindowSpec

    pool, hashes = cached_pool(backend)
    calls = []
    own = getattr(pool, "cached_run_from_end", None)

    def spy(*args):
        calls.append(args[2:])
        return own(*args) if own is not None else batch.cached_run_from_end(pool, *args)

    pool.cached_run_from_end = spy
    spec = SlidingWindowSpec(block_size=16, sliding_window=33)  # a hit: cdiv(32, 16) = 2 blocks
    hits = SlidingWindowManager.find_longest_cache_hit(hashes, 160, [0], pool, spec, False, 16)
    # Positions 8, 9 hit: a run of two; everything before it is null.
    assert calls == [(10, 2, 1, 0)]
    assert hits[0][:8] == [pool.null_block] * 8 and hits[0][8:] == [
        pool.get_cached_block(h, [0])[0] for h in hashes[8:10]]
    calls.clear()
    hits = SlidingWindowManager.find_longest_cache_hit(hashes, 128, [0], pool, spec, False, 32)
    # Up to 8 blocks; runs must end where 32 tokens do (after an even block count): the
    # run 4-5 ends there (6-7 misses at 7; the run 5-6 would end at an odd count).
    assert calls == [(8, 2, 2, 0)] and hits[0][:4] == [pool.null_block] * 4 \
        and len(hits[0]) == 6
