"""The protocol's ``observe()`` query answers the same on every backend."""

from __future__ import annotations

import pytest

from kvpool import make_pool
from kvpool.batch import observe
from kvpool.protocol import BlockPool
from kvpool.request import Request


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_observe_reports_ref_counts_keys_and_queue_front(backend) -> None:
    pool = make_pool(8, backend=backend)
    assert isinstance(pool, BlockPool)
    blocks = pool.get_new_blocks(3)
    pool.touch([blocks[0]])
    r = Request("r", list(range(32)))
    r.block_hashes.extend([b"h0", b"h1"])
    pool.cache_full_blocks(r, blocks, 0, 2, 16, 0)
    pool.free_blocks([blocks[2]])
    o = pool.observe()
    assert o.ref_cnts(blocks) == [2, 1, 0]
    assert [o.key_tokens(b) for b in blocks] == [16, 32, None]
    assert o.queue_front(2) == [blocks[2], 4]
    assert type(observe(pool)) is type(o)  # the batch checks read through the same query


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_max_key_tokens_is_the_longest_key_among_the_blocks(backend) -> None:
    pool = make_pool(8, backend=backend)
    blocks = pool.get_new_blocks(4)
    r = Request("r", list(range(48)))
    r.block_hashes.extend([b"h0", b"h1", b"h2"])
    pool.cache_full_blocks(r, blocks, 0, 3, 16, 0)
    o = pool.observe()
    assert o.max_key_tokens(blocks) == 48
    assert o.max_key_tokens([blocks[1], blocks[0]]) == 32  # order does not matter
    assert o.max_key_tokens([blocks[3]]) == 0  # no key
    assert o.max_key_tokens([pool.null_block, blocks[3]]) == 0  # the null block has none
    assert o.max_key_tokens([pool.null_block, blocks[0]]) == 16
    assert o.max_key_tokens([]) == 0
    # What it answers is what key_tokens says of each block.
    assert o.max_key_tokens(blocks) == max(o.key_tokens(b) or 0 for b in blocks)


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_max_key_tokens_refuses_what_is_not_an_id_of_the_pool(backend) -> None:
    from kvpool.errors import InvalidBlockId

    pool = make_pool(8, backend=backend)
    blocks = pool.get_new_blocks(2)
    r = Request("r", list(range(16)))
    r.block_hashes.append(b"h0")
    pool.cache_full_blocks(r, blocks, 0, 1, 16, 0)
    before = pool.abstract()
    for bad in ([8], [1, -1], [2**40], [2**70], [blocks[0], 2**64 - 1]):
        with pytest.raises(InvalidBlockId, match="out of range"):
            pool.observe().max_key_tokens(bad)
    for bad in ([2.5], ["3"], [1, 2.0], [True], [[1]]):
        with pytest.raises(InvalidBlockId, match="must be an int"):
            pool.observe().max_key_tokens(bad)
    assert pool.abstract() == before  # a read: nothing moved
    assert pool.observe().max_key_tokens(blocks) == 16
