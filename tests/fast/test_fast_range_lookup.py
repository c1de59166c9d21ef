"""``get_cached_blocks``: ``get_cached_block`` for each position of a range (the sliding-window
lookup reads its hashes a window at a time). The composition in :mod:`kvpool.batch` is the
definition; the fast pool's one kernel call must give the same result and the same error
(type and message) for every call, and change nothing."""

from __future__ import annotations

import pytest

from kvpool import batch, make_pool
from kvpool.errors import KvPoolError
from kvpool.hash_list import BlockHashList
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import Request

HASHER = get_request_block_hasher(16, BlockHasher("sha256", seed="range"))


def cached_pool(backend: str):
    """Ten keyed blocks in group 0 (positions 0-9 of request "a"), blocks 3 and 7 evicted
    (misses in the middle of the range), and positions 0-4 keyed in group 1 too."""
    pool = make_pool(64, backend=backend)
    request = Request("a", list(range(160)), block_hasher=HASHER)
    blocks = pool.get_new_blocks(10)
    pool.cache_full_blocks(request, blocks, 0, 10, 16, 0)
    pool.free_blocks(blocks[::-1])
    pool.evict_blocks([blocks[3], blocks[7]])
    more = pool.get_new_blocks(5)
    pool.cache_full_blocks(request, more, 0, 5, 16, 1)
    pool.free_blocks(more)
    return pool, list(request.block_hashes)


def outcome(call):
    try:
        return ("ok", call())
    except KvPoolError as error:
        return ("error", type(error).__name__, str(error))


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_each_position_is_what_get_cached_block_says(backend) -> None:
    pool, hashes = cached_pool(backend)
    before = pool.abstract()
    for groups in ([0], [1], [0, 1], [1, 0]):
        for start in range(11):
            for stop in range(start, 11):
                expected = [pool.get_cached_block(h, groups) for h in hashes[start:stop]]
                assert batch.get_cached_blocks(pool, hashes, groups, start, stop) == expected
                own = getattr(pool, "get_cached_blocks", None)
                if own is not None:
                    assert own(hashes, groups, start, stop) == expected
    got = batch.get_cached_blocks(pool, hashes, [0], 0, 10)
    assert [hit is None for hit in got] == [i in (3, 7) for i in range(10)]  # misses do not stop it
    assert pool.abstract() == before  # pure


def shapes(hashes: list[bytes]) -> dict[str, object]:
    packed = BlockHashList(hashes)
    packed.pack()
    return {"list": hashes, "tuple": tuple(hashes), "packed": packed,
            "unpacked": BlockHashList(hashes),
            "mixed-width": hashes[:4] + [hashes[4][:16]] + hashes[5:],
            "not-bytes-inside": hashes[:5] + [bytearray(hashes[5])] + hashes[6:],
            "not-bytes-outside": hashes[:9] + [str(hashes[9])],
            "str": "abc", "a-dict": {0: hashes[0]}}


@pytest.mark.parametrize("shape", list(shapes([b"x"] * 10)))
@pytest.mark.parametrize("groups", [[0], (0,), [0, 1], [1], [-1], [], [True], [2**32], (0.0,)])
@pytest.mark.parametrize("span", [(0, 10), (2, 6), (5, 5), (0, 0), (6, 2), (0, 11), (-1, 3),
                                  (True, 3), (0, 3.0), (None, 2)])
def test_the_kernel_answers_as_the_composition_and_refuses_as_it(shape, groups, span) -> None:
    pool, hashes = cached_pool("fast")
    hashes = shapes(hashes)[shape]
    start, stop = span
    before = pool.abstract()
    fast = outcome(lambda: pool.get_cached_blocks(hashes, groups, start, stop))
    generic = outcome(lambda: batch.get_cached_blocks(pool, hashes, groups, start, stop))
    assert fast == generic
    assert pool.abstract() == before
    if shape in ("list", "packed") and span == (2, 6) and groups in ([0], (0,)) \
            and type(groups[0]) is int:
        assert fast[0] == "ok" and [hit is None for hit in fast[1]] == [False, True, False,
                                                                         False]
    if shape == "not-bytes-outside" and span == (2, 6) and groups == [0]:
        assert fast[0] == "ok"  # only the range is read
