"""The prefix-cache operations of the reference backend, against the spec (BEHAVIOUR.md §6.6-6.12).

Same lockstep :class:`Twin` as the other operation tests, with concrete expectations.
"""

from __future__ import annotations

from reference_twin import Twin, block_hash, request_with_hashes

from kvpool.keys import pack_key


def key(label: str, group: int = 0) -> bytes:
    return pack_key(block_hash(label), group)


# -- cache_full_blocks (§6.6) ----------------------------------------------------------------


def test_cache_full_blocks_keys_each_position_with_its_token_count():
    twin = Twin(6)
    blocks = twin.get_new_blocks(3)
    twin.cache_full_blocks(request_with_hashes(3), blocks, 0, 3, 16, 0)
    state = twin.state
    assert state.primary_key[1:4] == (key("r:0"), key("r:1"), key("r:2"))
    assert state.primary_tokens[1:4] == (16, 32, 48)
    assert state.cache == {key("r:0"): (1,), key("r:1"): (2,), key("r:2"): (3,)}


def test_cache_full_blocks_starts_at_num_cached_blocks():
    twin = Twin(6)
    blocks = twin.get_new_blocks(3)
    request = request_with_hashes(3)
    twin.cache_full_blocks(request, blocks, 0, 1, 16, 0)
    twin.cache_full_blocks(request, blocks, 1, 3, 16, 0)
    assert twin.state.primary_key[1:4] == (key("r:0"), key("r:1"), key("r:2"))


def test_cache_full_blocks_skips_null_and_masked_out_blocks():
    twin = Twin(6)
    blocks = twin.get_new_blocks(2)
    table = [0, blocks[0], blocks[1]]
    twin.cache_full_blocks(request_with_hashes(3), table, 0, 3, 16, 0, [True, True, False])
    assert twin.state.primary_key[:3] == (None, key("r:1"), None)
    assert twin.state.cache == {key("r:1"): (1,)}


def test_cache_full_blocks_at_a_coarser_block_size_uses_the_last_fine_hash_of_each_block():
    twin = Twin(6)
    blocks = twin.get_new_blocks(2)
    twin.cache_full_blocks(request_with_hashes(4), blocks, 0, 2, 32, 3)
    assert twin.state.primary_key[1:3] == (key("r:1", 3), key("r:3", 3))
    assert twin.state.primary_tokens[1:3] == (32, 64)


def test_equal_full_blocks_of_two_requests_are_both_kept_under_one_key():
    twin = Twin(6)
    first, second = twin.get_new_blocks(1), twin.get_new_blocks(1)
    twin.cache_full_blocks(request_with_hashes(1), first, 0, 1, 16, 0)
    twin.cache_full_blocks(request_with_hashes(1), second, 0, 1, 16, 0)
    assert twin.state.cache == {key("r:0"): (1, 2)}


def test_caching_a_partially_keyed_block_in_full_promotes_it():
    twin = Twin(6)
    blocks = twin.get_new_blocks(1)
    request = request_with_hashes(2)
    twin.cache_partial_block(request, blocks[0], 16, 0, 32)
    twin.cache_full_blocks(request, blocks, 0, 1, 32, 0)
    assert twin.state.primary_key[1] == key("r:1")
    assert twin.state.primary_tokens[1] == 32
    assert twin.state.cache == {key("r:1"): (1,)}


# -- cache_partial_block (§6.7) --------------------------------------------------------------


def test_cache_partial_block_registers_an_entry_ending_inside_the_block_and_returns_its_key():
    twin = Twin(4)
    (block,) = twin.get_new_blocks(1)
    returned = twin.cache_partial_block(request_with_hashes(2), block, 16, 0, 32)
    assert returned == key("r:0")
    assert (twin.state.primary_key[1], twin.state.primary_tokens[1]) == (key("r:0"), 16)


def test_cache_partial_block_on_the_null_block_returns_none_and_changes_nothing():
    twin = Twin(4)
    before = twin.ref.abstract()
    assert twin.cache_partial_block(request_with_hashes(2), 0, 16, 0, 32) is None
    assert twin.ref.abstract() == before


def test_a_partial_entry_grows_replacing_the_shorter_primary():
    twin = Twin(4)
    (block,) = twin.get_new_blocks(1)
    request = request_with_hashes(3)
    twin.cache_partial_block(request, block, 16, 0, 48)
    twin.cache_partial_block(request, block, 32, 0, 48)
    assert (twin.state.primary_key[1], twin.state.primary_tokens[1]) == (key("r:1"), 32)
    assert twin.state.cache == {key("r:1"): (1,)}


def test_a_shorter_entry_on_a_block_with_a_longer_primary_becomes_a_secondary():
    twin = Twin(4)
    (block,) = twin.get_new_blocks(1)
    request = request_with_hashes(3)
    twin.cache_partial_block(request, block, 32, 0, 48)
    twin.cache_partial_block(request, block, 16, 0, 48)
    assert twin.state.primary_key[1] == key("r:1")
    assert twin.state.secondary_keys == {1: (key("r:0"),)}
    assert twin.state.cache == {key("r:1"): (1,), key("r:0"): (1,)}


def test_replace_existing_hashes_drops_every_key_first():
    twin = Twin(4)
    (block,) = twin.get_new_blocks(1)
    request = request_with_hashes(3)
    twin.cache_partial_block(request, block, 32, 0, 48)
    twin.cache_partial_block(request, block, 16, 0, 48)
    twin.cache_partial_block(request, block, 16, 0, 48, replace_existing_hashes=True)
    assert (twin.state.primary_key[1], twin.state.primary_tokens[1]) == (key("r:0"), 16)
    assert twin.state.secondary_keys == {}
    assert twin.state.cache == {key("r:0"): (1,)}


# -- move_block_hashes (§6.8) ----------------------------------------------------------------


def test_move_block_hashes_hands_every_key_to_dst_primary_first_in_order():
    twin = Twin(6)
    src, dst = twin.get_new_blocks(2)
    request = request_with_hashes(4)
    twin.cache_partial_block(request, src, 64, 0, 64)
    twin.cache_partial_block(request, src, 16, 0, 64)
    twin.cache_partial_block(request, src, 48, 0, 64)
    twin.move_block_hashes(src, dst)
    state = twin.state
    assert (state.primary_key[src], state.primary_key[dst]) == (None, key("r:3"))
    assert state.primary_tokens[dst] == 64
    assert state.secondary_keys == {dst: (key("r:0"), key("r:2"))}


def test_moved_keys_make_dst_the_newest_duplicate():
    twin = Twin(6)
    a, src, dst = twin.get_new_blocks(3)
    request = request_with_hashes(1)
    twin.cache_full_blocks(request, [src], 0, 1, 16, 0)
    twin.cache_full_blocks(request, [a], 0, 1, 16, 0)
    twin.move_block_hashes(src, dst)
    assert twin.state.cache == {key("r:0"): (a, dst)}


def test_moving_from_an_unkeyed_block_is_a_no_op():
    twin = Twin(4)
    src, dst = twin.get_new_blocks(2)
    before = twin.ref.abstract()
    twin.move_block_hashes(src, dst)
    assert twin.ref.abstract() == before


# -- is_block_writable (§6.9) ----------------------------------------------------------------


def test_only_a_sole_owners_unkeyed_block_is_writable():
    twin = Twin(6)
    fresh, keyed, shared = twin.get_new_blocks(3)
    twin.cache_full_blocks(request_with_hashes(1), [keyed], 0, 1, 16, 0)
    twin.touch([shared])
    assert twin.is_block_writable(fresh) is True
    assert twin.is_block_writable(keyed) is False
    assert twin.is_block_writable(shared) is False
    assert twin.is_block_writable(0) is False
    assert twin.is_block_writable(4) is False  # free


# -- evict_blocks (§6.10) --------------------------------------------------------------------


def test_evict_blocks_drops_keys_but_keeps_ref_counts_and_queue_order():
    twin = Twin(6)
    blocks = twin.get_new_blocks(2)
    twin.cache_full_blocks(request_with_hashes(2), blocks, 0, 2, 16, 0)
    twin.free_blocks([blocks[1]])
    before = twin.state
    twin.evict_blocks([2, 1, 0])
    after = twin.state
    assert after.cache == {} and after.primary_key == (None,) * 6
    assert (after.ref_cnt, after.free_queue) == (before.ref_cnt, before.free_queue)


def test_an_evicted_in_use_block_goes_to_the_front_when_freed():
    twin = Twin(5)
    blocks = twin.get_new_blocks(1)
    twin.cache_full_blocks(request_with_hashes(1), blocks, 0, 1, 16, 0)
    twin.evict_blocks(blocks)
    twin.free_blocks(blocks)
    assert twin.state.free_queue == (1, 2, 3, 4)


# -- reset_prefix_cache (§6.11) --------------------------------------------------------------


def test_reset_prefix_cache_fails_and_changes_nothing_while_a_block_is_held():
    twin = Twin(5)
    blocks = twin.get_new_blocks(1)
    twin.cache_full_blocks(request_with_hashes(1), blocks, 0, 1, 16, 0)
    before = twin.ref.abstract()
    assert twin.reset_prefix_cache() is False
    assert twin.ref.abstract() == before


def test_reset_prefix_cache_forgets_every_key_and_keeps_queue_order():
    twin = Twin(6)
    blocks = twin.get_new_blocks(3)
    request = request_with_hashes(3)
    twin.cache_full_blocks(request, blocks, 0, 2, 16, 0)
    twin.cache_partial_block(request, blocks[2], 16, 0, 16)
    twin.free_blocks(blocks[::-1])
    queue = twin.state.free_queue
    assert twin.reset_prefix_cache() is True
    state = twin.state
    assert state.cache == {} and state.secondary_keys == {}
    assert state.primary_key == (None,) * 6
    assert state.free_queue == queue


def test_reset_prefix_cache_fires_every_watcher_in_table_order():
    twin = Twin(5)
    twin.get_new_blocks(3)
    twin.unpin_blocks([3])
    twin.unpin_blocks([1, 2])
    assert twin.reset_prefix_cache() is True
    assert twin.fired["reference"] == [3, 1, 2]
    assert twin.state.watchers == ()


def test_unpinned_blocks_do_not_block_a_reset():
    twin = Twin(4)
    twin.get_new_blocks(3)
    twin.unpin_blocks([1, 2, 3])
    assert twin.reset_prefix_cache() is True


# -- emit_cached_block_events and small queries (§6.12) --------------------------------------


def test_emit_cached_block_events_changes_no_state():
    twin, request = Twin(4), request_with_hashes(2)
    before = twin.ref.abstract()
    twin.emit_cached_block_events(request, 2, 16, 0)
    assert twin.ref.abstract() == before


def test_free_count_and_usage_count_cached_candidates_as_free():
    twin = Twin(5)
    blocks = twin.get_new_blocks(2)
    twin.cache_full_blocks(request_with_hashes(2), blocks, 0, 2, 16, 0)
    assert (twin.get_num_free_blocks(), twin.get_usage()) == (2, 0.5)
    twin.free_blocks(blocks)
    assert (twin.get_num_free_blocks(), twin.get_usage()) == (4, 0.0)


def test_a_one_block_pool_has_zero_usage_and_nothing_to_hand_out():
    twin = Twin(1)
    assert (twin.get_num_free_blocks(), twin.get_usage()) == (0, 0)
    assert twin.get_new_blocks(0) == []
