"""The circular-buffer manager (BEHAVIOUR.md §8, vLLM 0.33): one block per request, claimed
on first allocation; no hits, no caching, no skipping."""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidArgument, InvalidConfig
from kvpool.events import BlockStored
from kvpool.policy import CircularBufferSpec, FullAttentionSpec, KVCacheBlocks, RequestStatus
from kvpool.policy.circular_buffer import CircularBufferManager

from .helpers import manager, request

FULL = FullAttentionSpec(block_size=16)
RING = CircularBufferSpec(block_size=16)


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_a_request_holds_exactly_one_ring_block_for_its_whole_life(backend: str) -> None:
    m = manager(FULL, RING, num_blocks=32, backend=backend, enable_kv_cache_events=True)
    assert isinstance(m.coordinator.single_type_managers[1], CircularBufferManager)
    a = request("a", list(range(40)))
    assert m.coordinator.get_num_blocks_to_allocate("a", 40, ([], []), 0, 0, 40) == 3 + 1
    first = m.allocate_slots(a, 40)
    assert [len(g) for g in first.get_block_ids()] == [3, 1]
    ring = first.get_block_ids()[1]
    a.num_computed_tokens, a.status = 40, RequestStatus.RUNNING
    for _ in range(30):  # decode well past the ring's 16 rows: still the same block
        a.append_output_token_ids([7])
        out = m.allocate_slots(a, 1)
        assert out is not None and out.get_block_ids()[1] == []
        a.num_computed_tokens += 1
    assert m.get_block_ids("a")[1] == ring
    # Never keyed: the pool's events name only the full-attention group.
    assert all(e.group_idx == 0 for e in m.take_events() if isinstance(e, BlockStored))
    b = request("b", list(range(40)))
    hits, n = m.get_computed_blocks(b)
    assert n == 32 and hits.get_block_ids()[1] == []  # the ring group is never looked up
    m.free(a)
    assert m.block_pool.observe().ref_cnts(ring) == [0]


def test_ring_groups_take_no_hits_and_do_not_count_as_a_cacheable_spec() -> None:
    m = manager(FULL, RING, num_blocks=32)
    a = request("a", list(range(40)))
    ring_block = m.allocate_slots(a, 40).get_block_ids()[1][0]
    b = request("b", list(range(40)))
    before = m.block_pool.abstract()
    with pytest.raises(InvalidArgument, match="circular-buffer"):
        m.allocate_slots(b, 8, 32, KVCacheBlocks((m.get_block_ids("a")[0][:2],
                                                  [ring_block, ring_block])))
    assert m.block_pool.abstract() == before
    with pytest.raises(InvalidConfig, match="cacheable"):
        manager(RING, CircularBufferSpec(block_size=16, head_size=64), num_blocks=8)
