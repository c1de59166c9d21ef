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
