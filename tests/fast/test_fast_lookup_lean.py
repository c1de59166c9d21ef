"""The fast pool's lean lookup (one group, a list of bytes of one width) and its scalar
``ref_cnt`` answer exactly as the checked paths do: same hits, same errors."""

from __future__ import annotations

import pytest

from kvpool import batch, make_pool
from kvpool.errors import InvalidArgument, InvalidBlockId, KvPoolError
from kvpool.hash_list import BlockHashList
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import Request

HASHER = get_request_block_hasher(16, BlockHasher("sha256", seed="lean"))


def filled_pool():
    pool = make_pool(64, backend="fast")
    request = Request("a", list(range(160)), block_hasher=HASHER)
    blocks = pool.get_new_blocks(10)
    pool.cache_full_blocks(request, blocks, 0, 10, 16, 0)
    pool.free_blocks(blocks[::-1])
    return pool, request


def outcome(call):
    try:
        return ("ok", call())
    except KvPoolError as error:
        return ("error", type(error).__name__)


@pytest.mark.parametrize("shape", ["list", "tuple", "hash-list", "half", "miss-first",
                                   "mixed-width", "not-bytes", "empty"])
@pytest.mark.parametrize("groups", [[0], (0,), [1], [0, 1], [-1], []])
def test_the_lean_lookup_equals_the_checked_composition(shape, groups) -> None:
    pool, request = filled_pool()
    hashes = list(request.block_hashes)
    hashes = {"list": hashes, "tuple": tuple(hashes), "hash-list": BlockHashList(hashes),
              "half": hashes[:5], "miss-first": [b"x" * 32] + hashes,
              "mixed-width": hashes[:3] + [hashes[3][:16]] + hashes[4:],
              "not-bytes": hashes[:3] + [bytearray(hashes[3])], "empty": []}[shape]
    if shape == "hash-list":
        hashes.pack()
    fast = outcome(lambda: pool.find_longest_cache_hit(hashes, groups))
    generic = outcome(lambda: batch.find_longest_cache_hit(pool, hashes, groups))
    assert fast == generic
    if shape in ("list", "tuple", "hash-list") and list(groups) == [0]:
        assert len(fast[1][0]) == 10


@pytest.mark.parametrize("shape", ["list", "hash-list", "not-bytes-after", "not-bytes-before"])
@pytest.mark.parametrize("limit", [None, 0, 1, 4, 10, 12, True, -1, 2.0])
def test_a_limited_lookup_equals_the_checked_composition(shape, limit) -> None:
    # The fast policy's lookup scans the first `limit` hashes of a request's own list in
    # place (a packed companion stays usable): only those are scanned and checked.
    pool, request = filled_pool()
    hashes = list(request.block_hashes)
    hashes = {"list": hashes, "hash-list": BlockHashList(hashes),
              "not-bytes-after": hashes[:4] + [bytearray(hashes[4])] + hashes[5:],
              "not-bytes-before": hashes[:2] + [bytearray(hashes[2])] + hashes[3:]}[shape]
    fast = outcome(lambda: pool.find_longest_cache_hit(hashes, [0], limit))
    generic = outcome(lambda: batch.find_longest_cache_hit(pool, hashes, [0], limit))
    assert fast == generic
    if limit == 4:  # four hits, or the hash before the limit refused
        every = pool.find_longest_cache_hit(list(request.block_hashes), [0])[0]
        assert fast == (("ok", [every[:4]]) if shape != "not-bytes-before"
                        else ("error", "InvalidArgument"))


def test_ref_cnt_reads_one_block_as_observe_does() -> None:
    pool, _ = filled_pool()
    held = pool.get_new_blocks(3)
    pool.touch(held[:1])
    observer = pool.observe()
    assert [pool.ref_cnt(b) for b in range(1, 64)] == observer.ref_cnts(list(range(1, 64)))
    for bad in (-1, 64, 2**70, 1.0, True, "3"):
        with pytest.raises(InvalidBlockId):
            pool.ref_cnt(bad)
    assert issubclass(InvalidBlockId, KvPoolError) and not issubclass(InvalidArgument,
                                                                       InvalidBlockId)
