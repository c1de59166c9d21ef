"""The lockstep driver reports each kind of disagreement, with a reproduction that replays it."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.errors import ForeignBlock, NoFreeBlocks, WatcherError
from kvpool.harness import RAISE, RECORD, Divergence, Foreign, lockstep
from kvpool.harness.reproduction import Reproduction
from kvpool.harness.values import normalize
from kvpool.spec import ops
from kvpool.spec.pool import SpecPool


class ReversedAllocation(SpecPool):
    """Hands out the right blocks in the wrong order (state agrees, result does not)."""

    def get_new_blocks(self, num_blocks):
        return list(reversed(super().get_new_blocks(num_blocks)))


class PlainValueError(SpecPool):
    """Raises a bare ValueError where the spec raises NoFreeBlocks."""

    def _core_get_new_blocks(self, n):
        if isinstance(n, int) and n > len(self.state.free_queue):
            raise ValueError(f"Cannot get {n} free blocks from the pool")
        return super()._core_get_new_blocks(n)


class LookupTouches(SpecPool):
    """A lookup that takes a reference on what it finds (a query that mutates)."""

    def _core_get_cached_block(self, block_hash, group_ids):
        found = super()._core_get_cached_block(block_hash, group_ids)
        if found:
            self._apply(ops.touch(self.state, tuple(found)))
        return found


class CrashingSpec(SpecPool):
    def _core_touch(self, ids):
        raise IndexError("spec bug")


def test_agreeing_pools_return_the_oracles_normalised_answer():
    pool = lockstep(["spec", "reference"], num_blocks=8, hash_block_size=2)
    reply = pool.get_new_blocks(3)
    assert reply.value == [1, 2, 3] and reply.error is None
    assert pool.free_blocks([3, 2, 1]).error is None
    rejected = pool.get_new_blocks(99)
    assert rejected.rejected and isinstance(rejected.error, NoFreeBlocks)


def test_a_different_result_is_an_outcome_divergence():
    pool = lockstep(["spec", ReversedAllocation], num_blocks=8)
    with pytest.raises(Divergence) as caught:
        pool.get_new_blocks(2)
    assert caught.value.kind == "outcome"
    assert "returned [1, 2]" in caught.value.detail and "returned [2, 1]" in caught.value.detail


def test_a_different_error_type_is_an_outcome_divergence():
    pool = lockstep(["spec", PlainValueError], num_blocks=4)
    with pytest.raises(Divergence) as caught:
        pool.get_new_blocks(5)
    assert caught.value.kind == "outcome" and "NoFreeBlocks" in caught.value.detail


def test_a_rejected_call_that_changes_state_is_reported_as_such():
    pool = lockstep(["spec", "planted:rejected_free_half_applied"], num_blocks=8)
    pool.get_new_blocks(2)
    with pytest.raises(Divergence) as caught:
        pool.free_blocks([1, 2, 2])
    assert caught.value.kind == "rejected-mutated"
    assert "planted:rejected_free_half_applied" in caught.value.detail


def test_a_query_that_changes_state_is_reported_as_such():
    pool = lockstep(["spec", LookupTouches], num_blocks=8, hash_block_size=2)
    request = pool.make_request([1, 2, 3, 4])
    pool.get_new_blocks(2)
    pool.cache_full_blocks(request, [1, 2], 0, 2, 2, 0)
    with pytest.raises(Divergence) as caught:
        pool.get_cached_block(request.block_hashes[0], [0])
    assert caught.value.kind == "query-mutated"


def test_a_broken_invariant_is_named_with_its_witnesses():
    pool = lockstep(["spec", "planted:touch_stays_queued"], num_blocks=8)
    with pytest.raises(Divergence) as caught:
        pool.touch([3])
    assert caught.value.kind == "invariant"
    assert "queued_iff_unreferenced broken by (3,)" in caught.value.detail


def test_the_oracle_alone_is_checked_against_the_invariants():
    pool = lockstep(["planted:touch_stays_queued"], num_blocks=8)
    with pytest.raises(Divergence) as caught:
        pool.touch([2])
    assert caught.value.kind == "invariant"


def test_watchers_firing_in_another_order_is_reported():
    pool = lockstep(["spec", "planted:watchers_fire_reversed"], num_blocks=8)
    pool.get_new_blocks(3)
    pool.unpin_blocks([1, 2, 3], RECORD)
    with pytest.raises(Divergence) as caught:
        pool.get_new_blocks(7)
    assert caught.value.kind == "watchers"
    assert "(0, 1), (0, 2), (0, 3)" in caught.value.detail


def test_a_raising_watcher_completes_the_allocation_and_carries_its_result():
    pool = lockstep(["spec", "reference"], num_blocks=4)
    pool.get_new_blocks(2)
    pool.unpin_blocks([2, 1], RAISE)
    reply = pool.get_new_blocks(3)
    assert isinstance(reply.error, WatcherError) and not reply.rejected
    assert reply.value == [3, 2, 1]
    assert pool.fired[0] == [(0, 2), (0, 1)]


def test_events_that_do_not_replay_to_the_hash_table_are_reported():
    pool = lockstep(["planted:eviction_event_missing"], num_blocks=3, hash_block_size=2,
                    enable_kv_cache_events=True)
    request = pool.make_request([1, 2, 3, 4])
    pool.get_new_blocks(2)
    pool.cache_full_blocks(request, [1, 2], 0, 2, 2, 0)
    pool.free_blocks([2, 1])
    pool.get_new_blocks(2)  # evicts both keys, but emits no BlockRemoved
    with pytest.raises(Divergence) as caught:
        pool.take_events()
    assert caught.value.kind == "events"


def test_a_gap_in_sequence_numbers_is_reported():
    pool = lockstep(["planted:sequence_number_skips"], num_blocks=4, hash_block_size=2,
                    enable_kv_cache_events=True)
    request = pool.make_request([1, 2])
    pool.get_new_blocks(1)
    pool.cache_full_blocks(request, [1], 0, 1, 2, 0)
    with pytest.raises(Divergence) as caught:
        pool.take_events()
    assert caught.value.kind == "events" and "gap" in caught.value.detail


def test_re_reported_blocks_do_not_count_twice_in_the_replay():
    pool = lockstep(["spec", "reference"], num_blocks=4, hash_block_size=2,
                    enable_kv_cache_events=True)
    request = pool.make_request([1, 2, 3, 4])
    pool.get_new_blocks(2)
    pool.cache_full_blocks(request, [1, 2], 0, 2, 2, 0)
    pool.emit_cached_block_events(request, 2, 2, 0)
    assert len(pool.take_events().value) == 2


def test_an_oracle_crash_is_reported_as_a_spec_bug():
    pool = lockstep([CrashingSpec, "spec"], num_blocks=4)
    with pytest.raises(Divergence) as caught:
        pool.touch([1])
    assert caught.value.kind == "oracle-crash"


def test_foreign_blocks_are_routed_to_the_sibling_pool_or_rejected():
    pool = lockstep(["spec", "reference"], num_blocks=6)
    pool.get_new_blocks(1)
    assert pool.sibling_get_new_blocks(2).value == [1, 2]
    assert pool.free_blocks([1, Foreign(2), Foreign(1)]).error is None
    assert pool.sibling_state.free_queue == (2, 1, 3, 4, 5)  # unkeyed: to the front
    assert isinstance(pool.touch([Foreign(3)]).error, ForeignBlock)


def test_a_divergence_carries_a_reproduction_that_replays_it():
    pool = lockstep(["spec", "planted:free_batch_reversed"], num_blocks=8)
    pool.get_new_blocks(3)
    with pytest.raises(Divergence) as caught:
        pool.free_blocks([3, 1, 2])
    text = caught.value.reproduction
    assert text.splitlines()[-1].endswith("pool.free_blocks([3, 1, 2])  # <- diverged here")
    namespace: dict = {}
    exec(compile(text, "<reproduction>", "exec"), namespace)
    with pytest.raises(Divergence) as replayed:
        namespace["test_reproduction"]()
    assert replayed.value.kind == caught.value.kind == "state"


def test_reproduction_arguments_are_valid_python():
    log = Reproduction(setup="pool = lockstep(['spec'], num_blocks=4)")
    request = object()
    log.define("r0", request, "pool.make_request([1, 2])", {b"\x07" * 32: "r0.block_hashes[0]"})
    log.call("pool", "cache_full_blocks", (request, [1, 0], 0, 2, 4, 0, None), {})
    log.call("pool", "free_blocks", ([Foreign(3), 1],), {})
    log.call("pool", "unpin_blocks", ([1], RAISE), {})
    log.call("pool", "get_cached_block", (b"\x00\xff'", (1,)), {})
    log.call("pool", "get_cached_block", (b"\x07" * 32, [0]), {})
    text = log.render_test("test_case")
    compile(text, "<reproduction>", "exec")
    assert "pool.cache_full_blocks(r0, [1, 0], 0, 2, 4, 0, None)" in text
    assert "pool.free_blocks([Foreign(3), 1])" in text
    assert "pool.unpin_blocks([1], RAISE)" in text
    assert "(1,)" in text
    assert "pool.get_cached_block(r0.block_hashes[0], [0])" in text


def test_results_are_compared_as_plain_ints_and_lists():
    assert normalize(np.array([3, 1], dtype=np.int32)) == [3, 1]
    assert normalize((np.int64(2), 5)) == [2, 5]
    assert normalize(None) is None and normalize(True) is True
    assert normalize(np.float64(0.5)) == 0.5
