"""Golden event payloads, field by field, on every backend (issue 9, item 10).

The differential harness compares backends with each other and the replay check only looks
at hashes and groups, so a field that every backend gets wrong the same way (the shared event
builder) survived the whole suite: a ``BlockStored`` whose ``parent_block_hash`` named the
first new block instead of its parent. These literals were derived by hand from BEHAVIOUR.md
§6.6, §6.7 and §7 (hashes: sha256 with the harness seed; events use the low 64 bits).
"""

from __future__ import annotations

import pytest

from kvpool import make_pool
from kvpool.events import BlockRemoved, BlockStored
from kvpool.harness.requests import make_request

FINE = [12187669230714637085, 17763281614718802808, 16599333090637041310,
        1889819563340584025, 5690149053182232781, 4475925612962881632]
"""External (int) hashes of the request's six hbs-2 blocks (LoRA adapter-b, two images,
salt tenant-2: ``REQUEST_EXTRAS[4]``)."""


def scenario(backend: str) -> list:
    request = make_request(list(range(1, 13)), hash_block_size=2, request_id="g", extras=4)
    assert [h for h in request.block_hashes] and len(request.block_hashes) == 6
    pool = make_pool(6, backend=backend, hash_block_size=2, enable_kv_cache_events=True)
    pool.get_new_blocks(4)
    pool.cache_full_blocks(request, [1, 2, 3, 4], 1, 3, 4, 1)   # positions 1, 2 at bs 4
    pool.cache_partial_block(request, 4, 10, 0, 4)             # a partial entry at token 10
    pool.free_blocks([4, 3, 2, 1])
    pool.get_new_blocks(5)                                     # evicts all three keys
    return pool.take_events()


@pytest.fixture(params=["spec", "reference", "fast"])
def events(request):
    return scenario(request.param)


def test_a_full_block_store_reports_its_parent_hashes_tokens_and_keys(events):
    stored = events[0]
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [FINE[3], FINE[5]]      # coarse view: fine[2k+1]
    assert stored.parent_block_hash == FINE[1]             # logical position 0, not a new block
    assert stored.token_ids == [5, 6, 7, 8, 9, 10, 11, 12]  # [num_cached·bs, num_full·bs)
    assert stored.block_size == 4
    assert stored.lora_id == 9 and stored.lora_name == "adapter-b"
    assert stored.medium == "GPU" and stored.group_idx == 1
    assert stored.extra_keys == [("adapter-b", ("image-2", 1)), ("adapter-b", ("image-2", -3))]
    assert stored.session_id is None and stored.lookahead_token_ids is None
    assert stored.seq == 0


def test_a_partial_entry_reports_one_hbs_window(events):
    stored = events[1]
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [FINE[4]] and stored.parent_block_hash == FINE[3]
    assert stored.token_ids == [9, 10] and stored.block_size == 2
    assert stored.extra_keys == [("adapter-b", ("image-2", -3))]
    assert stored.group_idx == 0 and stored.lora_id == 9 and stored.seq == 1


def test_eviction_reports_one_removal_per_key_in_queue_order(events):
    removed = events[2:]
    assert all(isinstance(e, BlockRemoved) for e in removed) and len(removed) == 3
    assert [(e.block_hashes, e.group_idx, e.seq) for e in removed] == [
        ([FINE[4]], 0, 2), ([FINE[5]], 1, 3), ([FINE[3]], 1, 4)]
    assert all(e.medium == "GPU" for e in removed)


def test_the_first_store_of_a_table_has_no_parent():
    request = make_request([1, 2, 3, 4], hash_block_size=2, request_id="h")
    pool = make_pool(4, backend="reference", hash_block_size=2, enable_kv_cache_events=True)
    pool.get_new_blocks(2)
    pool.cache_full_blocks(request, [1, 2], 0, 2, 2, 0)
    (stored,) = pool.take_events()
    assert stored.parent_block_hash is None and stored.token_ids == [1, 2, 3, 4]
    assert stored.lora_id is None and stored.lora_name is None
    assert stored.extra_keys == [None, None]  # one entry per block; None: no extra keys
