"""Event records of the reference core: same records, same sequence numbers as the spec (§6, §7).

Records are compared at the core level (``_core_*`` of a spec pool and a reference pool),
which needs no request hashing; the public events built from them are compared as well
once :mod:`kvpool.hashing` provides the event helpers.
"""

from __future__ import annotations

import importlib

import pytest
from reference_twin import Twin, block_hash, request_with_hashes

from kvpool.keys import pack_key
from kvpool.reference import ReferenceBlockPool
from kvpool.spec.pool import SpecPool
from kvpool.spec.records import ClearedRecord, PartialStoredRecord, RemovedRecord, StoredRecord


def key(label: str, group: int = 0) -> bytes:
    return pack_key(block_hash(label), group)


def plain(value):
    """Lists as tuples, recursively, so that spec and reference returns compare."""
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    return value


class CoreTwin:
    """Spec and reference *cores* in lockstep: ``twin.free((1,))`` calls ``_core_free``."""

    def __init__(self, num_blocks: int = 8, **options):
        options.setdefault("enable_kv_cache_events", True)
        self.spec = SpecPool(num_blocks, **options)
        self.ref = ReferenceBlockPool(num_blocks, **options)

    def __getattr__(self, name: str):
        def call(*args):
            expected = getattr(self.spec, f"_core_{name}")(*args)
            got = getattr(self.ref, f"_core_{name}")(*args)
            assert plain(got) == plain(expected), name
            assert self.ref._core_state() == self.spec._core_state(), name
            return got

        return call


def test_allocation_eviction_emits_one_removed_record_per_key_primary_then_secondaries():
    twin, request = CoreTwin(4), request_with_hashes(3)
    twin.get_new_blocks(1)
    twin.cache_partial_block(request.block_hashes, 1, 48, 0, 48, False)
    twin.cache_partial_block(request.block_hashes, 1, 32, 0, 48, False)
    twin.cache_partial_block(request.block_hashes, 1, 16, 0, 48, False)
    twin.free((1,))
    twin.get_new_blocks(2)  # 2, 3: uncached, no records
    _, records, _ = twin.get_new_blocks(1)
    assert records == (
        RemovedRecord(3, key("r:2")),
        RemovedRecord(4, key("r:1")),
        RemovedRecord(5, key("r:0")),
    )


def test_a_promotion_emits_its_removals_before_the_one_stored_record():
    twin, request = CoreTwin(4), request_with_hashes(2)
    twin.get_new_blocks(1)
    records = twin.cache_partial_block(request.block_hashes, 1, 16, 0, 32, False)[1]
    assert records == (PartialStoredRecord(0, 0, 16, block_hash("r:0")),)
    records = twin.cache_full_blocks(request.block_hashes, (1,), 0, 1, 32, 0, None)
    assert records == (
        RemovedRecord(1, key("r:0")),
        StoredRecord(2, 0, 32, 0, 1, (0,), (block_hash("r:1"),)),
    )


def test_one_stored_record_names_only_the_positions_that_received_a_key():
    twin, request = CoreTwin(6), request_with_hashes(4)
    twin.get_new_blocks(2)
    records = twin.cache_full_blocks(request.block_hashes, (0, 1, 2, 0), 0, 4, 16, 5, None)
    assert records == (
        StoredRecord(0, 5, 16, 0, 4, (1, 2), (block_hash("r:1"), block_hash("r:2"))),
    )


def test_a_stored_record_with_no_positions_is_emitted_when_every_candidate_is_skipped():
    twin, request = CoreTwin(4), request_with_hashes(2)
    twin.get_new_blocks(1)
    records = twin.cache_full_blocks(request.block_hashes, (0, 1), 0, 2, 16, 0, (True, False))
    assert records == (StoredRecord(0, 0, 16, 0, 2, (), ()),)


def test_re_registering_a_partial_entry_the_block_already_has_emits_nothing():
    twin, request = CoreTwin(4), request_with_hashes(2)
    twin.get_new_blocks(1)
    twin.cache_partial_block(request.block_hashes, 1, 16, 0, 32, False)
    assert twin.cache_partial_block(request.block_hashes, 1, 16, 0, 32, False)[1] == ()


def test_evict_blocks_emits_a_removed_record_per_key_in_id_order_of_the_call():
    twin, request = CoreTwin(5), request_with_hashes(2)
    twin.get_new_blocks(2)
    twin.cache_full_blocks(request.block_hashes, (1, 2), 0, 2, 16, 0, None)
    records = twin.evict_blocks((2, 3, 1))
    assert records == (RemovedRecord(1, key("r:1")), RemovedRecord(2, key("r:0")))


def test_reset_emits_one_cleared_record_and_no_removals():
    twin, request = CoreTwin(4), request_with_hashes(2)
    twin.get_new_blocks(2)
    twin.cache_full_blocks(request.block_hashes, (1, 2), 0, 2, 16, 0, None)
    twin.free((2, 1))
    assert twin.reset_prefix_cache() == (True, (ClearedRecord(1),), ())


def test_touch_free_unpin_and_move_emit_nothing_and_keep_the_counter():
    twin, request = CoreTwin(5), request_with_hashes(1)
    twin.get_new_blocks(3)
    twin.cache_full_blocks(request.block_hashes, (1,), 0, 1, 16, 0, None)
    twin.touch((1,))
    twin.free((1,))
    twin.unpin((2,))
    twin.move_block_hashes(1, 3)
    assert twin.ref._core_state().event_count == 1


def test_emit_cached_block_events_reports_every_position_including_null_ones():
    twin, request = CoreTwin(4), request_with_hashes(4)
    records = twin.emit_cached_block_events(request.block_hashes, 2, 32, 1)
    assert records == (
        StoredRecord(0, 1, 32, 0, 2, (0, 1), (block_hash("r:1"), block_hash("r:3"))),
    )
    assert twin.emit_cached_block_events(request.block_hashes, 0, 32, 1) == ()


def test_with_events_disabled_no_record_is_made_and_the_counter_stays_zero():
    twin, request = CoreTwin(4, enable_kv_cache_events=False), request_with_hashes(2)
    twin.get_new_blocks(1)
    assert twin.cache_full_blocks(request.block_hashes, (1,), 0, 1, 16, 0, None) == ()
    twin.free((1,))
    assert twin.get_new_blocks(1)[1] == ()
    assert twin.ref._core_state().event_count == 0


def _event_hashing_available() -> bool:
    hashing = importlib.import_module("kvpool.hashing")
    return all(hasattr(hashing, name) for name in ("event_extra_keys", "resolve_block_hashes"))


@pytest.mark.skipif(not _event_hashing_available(), reason="kvpool.hashing event helpers missing")
def test_public_events_of_a_caching_workload_equal_the_specs():
    twin, request = Twin(6, enable_kv_cache_events=True), request_with_hashes(4)
    blocks = twin.get_new_blocks(3)
    twin.cache_partial_block(request, blocks[0], 16, 0, 32)
    twin.cache_full_blocks(request, blocks[:2], 0, 2, 32, 0)  # promotes block 1
    twin.free_blocks(blocks[::-1])
    twin.get_new_blocks(4)  # 3, 4, 5, then 1: evicts r:1
    events = twin.ref.take_events()
    assert events == twin.spec.take_events()  # the twin compared them pending, too
    assert [type(e).__name__ for e in events] == [
        "BlockStored",
        "BlockRemoved",
        "BlockStored",
        "BlockRemoved",
    ]
    assert [e.seq for e in events] == [0, 1, 2, 3]
