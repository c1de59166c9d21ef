"""The spec operations' documented behaviour on small hand-built states (BEHAVIOUR.md §4-6)."""

from __future__ import annotations

from spec_builders import key, make_state

from kvpool.spec import ops
from kvpool.spec.records import ClearedRecord, PartialStoredRecord, RemovedRecord, StoredRecord
from kvpool.spec.state import initial_state, keys_of_block

K1, K2, K3 = key(1), key(2), key(3)
H = [bytes([h]) for h in range(8)]  # block hashes; key(h) == pack_key(H[h], 0)

# --- get_new_blocks --------------------------------------------------------------------------


def test_a_fresh_pool_hands_out_blocks_in_id_order_never_the_null_block():
    out = ops.get_new_blocks(initial_state(5), 3)
    assert out.result == (1, 2, 3)
    assert out.state.free_queue == (4,)
    assert out.state.ref_cnt == (0, 1, 1, 1, 0)


def test_getting_zero_blocks_returns_nothing_and_changes_nothing():
    state = initial_state(3)
    assert ops.get_new_blocks(state, 0) == ops.Outcome(state, ())


def test_allocation_evicts_each_popped_blocks_keys_primary_first_with_numbered_events():
    state = make_state(
        4, keys={1: (K1, 1), 3: (K3, 1)}, secondary={1: (K2,)}, queue=(1, 2, 3),
        events=True, event_count=5,
    )
    out = ops.get_new_blocks(state, 3)
    assert out.events == (RemovedRecord(5, K1), RemovedRecord(6, K2), RemovedRecord(7, K3))
    assert out.state.event_count == 8
    assert out.state.cache == {} and out.state.secondary_keys == {}
    assert all(not keys_of_block(out.state, b) for b in (1, 2, 3))


def test_allocation_evicts_the_least_recently_released_cached_block_first():
    state = make_state(4, keys={1: (K1, 1), 2: (K2, 1)}, queue=(2, 1, 3))
    out = ops.get_new_blocks(state, 1)
    assert out.result == (2,)
    assert out.state.cache == {K1: (1,)}


def test_watchers_of_popped_blocks_fire_in_pop_order_and_are_consumed():
    state = make_state(5, queue=(3, 1, 2, 4), watchers=(1, 4, 3))
    out = ops.get_new_blocks(state, 2)
    assert out.fired_watchers == (3, 1)
    assert out.state.watchers == (4,)


# --- touch -----------------------------------------------------------------------------------


def test_touch_takes_queued_hits_out_of_the_queue_and_keeps_keys():
    state = make_state(4, ref={2: 1}, keys={1: (K1, 1), 2: (K2, 1)}, queue=(3, 1))
    out = ops.touch(state, (1, 2, 0))
    assert out.state.ref_cnt == (0, 1, 2, 0)
    assert out.state.free_queue == (3,)
    assert out.state.cache == state.cache and out.events == ()


def test_touching_a_block_twice_in_one_batch_counts_twice_and_unlinks_once():
    out = ops.touch(make_state(3), (2, 2))
    assert out.state.ref_cnt == (0, 0, 2)
    assert out.state.free_queue == (1,)


# --- free_blocks -----------------------------------------------------------------------------


def test_freed_uncached_blocks_go_to_the_front_in_batch_order_and_lifo_across_calls():
    state = make_state(6, ref={1: 1, 2: 1, 3: 1, 4: 1}, queue=(5,))
    state = ops.free_blocks(state, (2, 1)).state
    assert state.free_queue == (2, 1, 5)
    state = ops.free_blocks(state, (4, 3)).state
    assert state.free_queue == (4, 3, 2, 1, 5)


def test_freed_cached_blocks_go_to_the_tail_in_batch_order():
    state = make_state(5, ref={1: 1, 2: 1, 3: 1}, keys={1: (K1, 1), 2: (K2, 1)}, queue=(4,))
    out = ops.free_blocks(state, (2, 3, 1))
    assert out.state.free_queue == (3, 4, 2, 1)


def test_a_block_reaching_zero_on_its_last_release_in_the_batch_is_queued_once():
    state = make_state(4, ref={1: 2, 2: 1}, queue=(3,))
    out = ops.free_blocks(state, (1, 2, 1))
    assert out.state.free_queue == (2, 1, 3)
    assert out.state.ref_cnt == (0, 0, 0, 0)


def test_a_block_still_held_after_release_stays_out_of_the_queue():
    out = ops.free_blocks(make_state(3, ref={1: 2}), (1,))
    assert out.state.ref_cnt[1] == 1 and 1 not in out.state.free_queue


def test_the_null_block_is_skipped_by_free():
    state = make_state(3, ref={1: 1})
    assert ops.free_blocks(state, (0, 1, 0)).state.free_queue == (1, 2)


def test_with_caching_disabled_freed_blocks_go_to_the_front():
    state = ops.get_new_blocks(initial_state(4, enable_caching=False), 2).state
    assert ops.free_blocks(state, (1, 2)).state.free_queue == (1, 2, 3)


def test_free_changes_no_key_and_no_watcher_and_emits_nothing():
    state = make_state(3, ref={1: 1}, keys={1: (K1, 1)}, watchers=(1,), events=True)
    out = ops.free_blocks(state, (1,))
    assert out.state.cache == state.cache and out.state.watchers == (1,) and out.events == ()


# --- unpin_blocks ----------------------------------------------------------------------------


def test_unpinned_blocks_go_to_the_tail_even_without_a_key():
    state = make_state(4, ref={1: 1, 2: 1}, queue=(3,))
    out = ops.unpin_blocks(state, (2, 1))
    assert out.state.free_queue == (3, 2, 1)


def test_unpin_registers_a_watcher_even_when_the_block_stays_held():
    out = ops.unpin_blocks(make_state(3, ref={1: 2}), (1,))
    assert out.state.watchers == (1,) and out.state.ref_cnt[1] == 1
    assert 1 not in out.state.free_queue


def test_a_block_watched_again_keeps_its_place_in_the_watcher_table():
    state = make_state(4, ref={1: 2, 2: 1}, watchers=(1,))
    out = ops.unpin_blocks(state, (2, 1))
    assert out.state.watchers == (1, 2)


# --- get_cached_block ------------------------------------------------------------------------


def test_a_lookup_answers_one_block_per_group_in_the_order_the_groups_were_given():
    state = make_state(4, ref={1: 1}, keys={1: (key(5, 0), 1), 2: (key(5, 1), 1)}, queue=(2, 3))
    assert ops.get_cached_block(state, H[5], (1, 0)).result == (2, 1)


def test_a_lookup_is_all_or_nothing_across_groups():
    state = make_state(3, keys={1: (key(5, 0), 1)})
    assert ops.get_cached_block(state, H[5], (0, 1)).result is None


def test_under_a_duplicated_key_the_earliest_inserted_block_answers_and_nothing_changes():
    state = make_state(4, keys={1: (K1, 1), 3: (K1, 1)}, cache={K1: (3, 1)})
    out = ops.get_cached_block(state, H[1], (0,))
    assert out.result == (3,) and out.state is state


# --- cache_full_blocks -----------------------------------------------------------------------


def test_caching_gives_each_position_its_key_covering_the_whole_prefix():
    state = make_state(4, ref={1: 1, 2: 1}, queue=(3,), hbs=2, events=True)
    out = ops.cache_full_blocks(state, H[1:5], (1, 2), 0, 2, 2, 0)
    assert out.state.primary_key[1:3] == (key(1), key(2))
    assert out.state.primary_tokens[1:3] == (2, 4)
    assert out.events == (StoredRecord(0, 0, 2, 0, 2, (0, 1), (H[1], H[2])),)


def test_a_larger_block_size_uses_the_last_fine_hash_inside_each_block():
    state = make_state(4, ref={1: 1, 2: 1}, queue=(3,), hbs=2)
    out = ops.cache_full_blocks(state, H[1:5], (1, 2), 0, 2, 4, 0)
    assert out.state.primary_key[1:3] == (key(2), key(4))
    assert out.state.primary_tokens[1:3] == (4, 8)


def test_equal_content_is_not_deduplicated_the_newer_block_joins_the_key():
    state = make_state(4, ref={1: 1, 2: 1}, keys={1: (K1, 1)}, queue=(3,))
    out = ops.cache_full_blocks(state, (H[1],), (2,), 0, 1, 1, 0)
    assert out.state.cache == {K1: (1, 2)}


def test_null_and_masked_out_blocks_are_skipped_but_their_positions_counted():
    state = make_state(4, ref={1: 1, 2: 1}, queue=(3,), events=True)
    out = ops.cache_full_blocks(state, H[1:4], (0, 1, 2), 0, 3, 1, 0, (True, False, True))
    assert out.state.primary_key[1:3] == (None, key(3))
    assert out.state.primary_tokens[2] == 3
    assert out.events == (StoredRecord(0, 0, 1, 0, 3, (2,), (H[3],)),)


def test_a_partial_entry_is_promoted_old_keys_removed_before_the_stored_event():
    state = make_state(3, ref={1: 1}, keys={1: (K1, 1)}, secondary={1: (K3,)}, queue=(2,),
                       events=True, event_count=2)
    out = ops.cache_full_blocks(state, (H[4], H[5]), (9, 1), 1, 2, 1, 0)
    assert keys_of_block(out.state, 1) == (key(5),)
    assert out.state.primary_tokens[1] == 2
    assert out.events == (
        RemovedRecord(2, K1),
        RemovedRecord(3, K3),
        StoredRecord(4, 0, 1, 1, 2, (1,), (H[5],)),
    )


def test_nothing_to_cache_is_a_silent_no_op_but_all_skipped_still_emits():
    state = make_state(3, ref={1: 1}, events=True)
    assert ops.cache_full_blocks(state, (H[1],), (1,), 1, 1, 1, 0) == ops.Outcome(state)
    out = ops.cache_full_blocks(state, (H[1],), (0,), 0, 1, 1, 0)
    assert out.events == (StoredRecord(0, 0, 1, 0, 1, (), ()),)


# --- cache_partial_block ---------------------------------------------------------------------


def test_a_partial_entry_grows_replacing_a_shorter_primary():
    state = make_state(3, ref={1: 1}, keys={1: (K1, 1)}, events=True)
    out = ops.cache_partial_block(state, H[1:4], 1, 3, 0, 4)
    assert out.result == key(3)
    assert keys_of_block(out.state, 1) == (key(3),) and out.state.primary_tokens[1] == 3
    assert out.events == (RemovedRecord(0, K1), PartialStoredRecord(1, 0, 3, H[3]))


def test_a_shorter_entry_on_a_longer_primary_becomes_a_secondary_key():
    state = make_state(3, ref={1: 1}, keys={1: (K3, 3)})
    out = ops.cache_partial_block(state, H[1:4], 1, 2, 0, 4)
    assert keys_of_block(out.state, 1) == (K3, key(2)) and out.state.primary_tokens[1] == 3


def test_an_entry_already_present_emits_nothing_unless_replaced():
    state = make_state(3, ref={1: 1}, keys={1: (K2, 2)}, events=True)
    assert ops.cache_partial_block(state, H[1:3], 1, 2, 0, 4).events == ()
    out = ops.cache_partial_block(state, H[1:3], 1, 2, 0, 4, replace_existing=True)
    assert out.events == (RemovedRecord(0, K2), PartialStoredRecord(1, 0, 2, H[2]))


def test_a_partial_entry_on_the_null_block_is_a_no_op():
    state = make_state(3)
    assert ops.cache_partial_block(state, H[1:3], 0, 2, 0, 4) == ops.Outcome(state, None)


# --- move_block_hashes, evict_blocks ---------------------------------------------------------


def test_moving_hashes_hands_every_key_in_order_to_the_newest_duplicate():
    state = make_state(4, ref={1: 1, 2: 1, 3: 1}, keys={1: (K1, 4), 3: (K1, 4)},
                       secondary={1: (K2, K3)}, queue=(), events=True)
    out = ops.move_block_hashes(state, 1, 2)
    assert keys_of_block(out.state, 2) == (K1, K2, K3) and out.state.primary_tokens[2] == 4
    assert keys_of_block(out.state, 1) == ()
    assert out.state.cache[K1] == (3, 2)
    assert out.events == ()


def test_eviction_drops_keys_of_in_use_blocks_which_then_free_to_the_front():
    state = make_state(4, ref={1: 1}, keys={1: (K1, 1)}, secondary={1: (K2,)}, queue=(2, 3),
                       events=True)
    out = ops.evict_blocks(state, (1, 1, 0))
    assert out.events == (RemovedRecord(0, K1), RemovedRecord(1, K2))
    assert out.state.ref_cnt == state.ref_cnt and out.state.free_queue == (2, 3)
    assert ops.free_blocks(out.state, (1,)).state.free_queue == (1, 2, 3)


# --- reset_prefix_cache ----------------------------------------------------------------------


def test_reset_is_refused_while_any_block_is_held():
    state = make_state(3, ref={2: 1}, keys={2: (K1, 1)})
    assert ops.reset_prefix_cache(state) == ops.Outcome(state, False)


def test_reset_drops_every_key_fires_watchers_in_table_order_and_keeps_the_queue():
    state = make_state(4, keys={1: (K1, 1), 2: (K2, 1)}, queue=(3, 2, 1), watchers=(2, 1),
                       events=True, event_count=4)
    out = ops.reset_prefix_cache(state)
    assert out.result is True and out.fired_watchers == (2, 1)
    assert out.state.cache == {} and out.state.primary_key == (None,) * 4
    assert out.state.free_queue == (3, 2, 1) and out.state.watchers == ()
    assert out.events == (ClearedRecord(4),)


def test_unpinned_blocks_count_as_free_for_a_reset():
    state = ops.unpin_blocks(make_state(3, ref={1: 1}, keys={1: (K1, 1)}), (1,)).state
    out = ops.reset_prefix_cache(state)
    assert out.result is True and out.fired_watchers == (1,)


# --- events and queries ----------------------------------------------------------------------


def test_event_sequence_numbers_continue_across_operations():
    state = make_state(3, ref={1: 1}, events=True)
    state = ops.cache_full_blocks(state, (H[1],), (1,), 0, 1, 1, 0).state
    state = ops.evict_blocks(state, (1,)).state
    out = ops.emit_cached_block_events(state, (H[1], H[2]), 2, 1, 0)
    assert out.events == (StoredRecord(2, 0, 1, 0, 2, (0, 1), (H[1], H[2])),)


def test_with_events_disabled_nothing_is_emitted_or_counted():
    state = make_state(3, ref={1: 1}, keys={1: (K1, 1)})
    out = ops.evict_blocks(state, (1,))
    assert out.events == () and out.state.event_count == 0


def test_a_block_is_writable_only_when_private_and_unkeyed():
    state = make_state(5, ref={1: 1, 2: 2, 3: 1}, keys={3: (K1, 1)}, queue=(4,))
    assert [ops.is_block_writable(state, b).result for b in range(5)] == [
        False, True, False, False, False
    ]
