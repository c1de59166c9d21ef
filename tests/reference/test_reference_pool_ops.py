"""Every pool operation of the reference backend, against the spec, on hand-written scenarios.

Each test drives a spec pool and a reference pool in lockstep (:class:`Twin`: equal results,
equal error types, equal ``abstract()`` after every call, reference invariants hold) and also
asserts the documented behaviour concretely (BEHAVIOUR.md §4, §6).
"""

from __future__ import annotations

from reference_twin import Twin, block_hash, request_with_hashes

from kvpool.keys import pack_key


def key(label: str, group: int = 0) -> bytes:
    return pack_key(block_hash(label), group)


def cached_twin(num_blocks: int = 8, num_cached: int = 3, **options) -> tuple[Twin, list[int]]:
    """A twin whose blocks 1…num_cached hold the cached prefix r:0, r:1, … (still in use)."""
    twin = Twin(num_blocks, **options)
    blocks = twin.get_new_blocks(num_cached)
    twin.cache_full_blocks(request_with_hashes(num_cached), blocks, 0, num_cached, 16, 0)
    return twin, blocks


# -- get_new_blocks (§6.1) -------------------------------------------------------------------


def test_a_fresh_pool_hands_out_blocks_in_id_order_skipping_the_null_block():
    twin = Twin(6)
    assert twin.get_new_blocks(3) == [1, 2, 3]
    assert twin.state.ref_cnt == (0, 1, 1, 1, 0, 0)
    assert twin.state.free_queue == (4, 5)


def test_get_new_blocks_of_zero_returns_an_empty_list():
    twin = Twin(4)
    assert twin.get_new_blocks(0) == []
    assert twin.get_num_free_blocks() == 3


def test_allocation_evicts_the_keys_of_a_cached_free_block():
    twin, blocks = cached_twin(4, 3)
    twin.free_blocks(blocks[::-1])
    assert twin.get_cached_block(block_hash("r:2"), [0]) == [3]
    assert twin.get_new_blocks(1) == [3]  # the chain tail was freed first, so it goes first
    assert twin.get_cached_block(block_hash("r:2"), [0]) is None
    assert twin.state.primary_key[3] is None
    assert twin.get_cached_block(block_hash("r:0"), [0]) == [1]


def test_a_cached_block_stays_findable_until_it_is_reallocated():
    twin, blocks = cached_twin(5, 2)
    twin.free_blocks(blocks)
    twin.get_new_blocks(2)  # blocks 3 and 4: the uncached front zone goes first
    assert twin.get_cached_block(block_hash("r:1"), [0]) == [2]


# -- touch (§6.2) ----------------------------------------------------------------------------


def test_touching_a_free_cached_block_takes_it_out_of_the_queue():
    twin, blocks = cached_twin(5, 2)
    twin.free_blocks(blocks)
    twin.touch([1])
    assert twin.state.ref_cnt[1] == 1
    assert 1 not in twin.state.free_queue
    assert twin.state.primary_key[1] == key("r:0")


def test_touching_a_held_block_only_adds_a_reference():
    twin = Twin(4)
    twin.get_new_blocks(1)
    twin.touch([1, 1])
    assert twin.state.ref_cnt[1] == 3


def test_touch_skips_the_null_block():
    twin = Twin(4)
    twin.touch([0, 0])
    assert twin.state.ref_cnt[0] == 0
    assert twin.get_num_free_blocks() == 3


# -- free_blocks (§6.3) ----------------------------------------------------------------------


def test_freed_uncached_blocks_go_to_the_front_in_batch_order():
    twin = Twin(6)
    twin.get_new_blocks(3)
    twin.free_blocks([3, 1])
    assert twin.state.free_queue == (3, 1, 4, 5)


def test_the_most_recently_freed_uncached_batch_is_reused_first():
    twin = Twin(6)
    twin.get_new_blocks(4)
    twin.free_blocks([1, 2])
    twin.free_blocks([3])
    assert twin.state.free_queue == (3, 1, 2, 5)
    assert twin.get_new_blocks(1) == [3]


def test_freed_cached_blocks_go_to_the_tail_in_batch_order():
    twin, blocks = cached_twin(6, 3)
    twin.free_blocks(blocks[::-1])
    assert twin.state.free_queue == (4, 5, 3, 2, 1)


def test_a_mixed_batch_splits_into_front_and_tail_zones_keeping_order_in_each():
    twin, blocks = cached_twin(8, 2)
    extra = twin.get_new_blocks(2)  # 3, 4: uncached
    twin.free_blocks([extra[1], blocks[1], extra[0], blocks[0]])
    assert twin.state.free_queue == (4, 3, 5, 6, 7, 2, 1)


def test_a_block_with_other_holders_stays_out_of_the_queue():
    twin = Twin(4)
    twin.get_new_blocks(1)
    twin.touch([1])
    twin.free_blocks([1])
    assert twin.state.ref_cnt[1] == 1
    assert 1 not in twin.state.free_queue


def test_free_blocks_skips_the_null_block():
    twin = Twin(4)
    twin.get_new_blocks(1)
    twin.free_blocks([0, 1, 0])
    assert twin.state.ref_cnt[0] == 0
    assert twin.state.free_queue == (1, 2, 3)


def test_free_blocks_consumes_any_iterable_once():
    twin = Twin(4)
    twin.get_new_blocks(2)
    twin.ref.free_blocks(iter([2, 1]))
    twin.spec.free_blocks(iter([2, 1]))
    assert twin.ref.abstract() == twin.spec.abstract()
    assert twin.state.free_queue == (2, 1, 3)


def test_with_caching_disabled_every_freed_block_goes_to_the_front():
    twin = Twin(5, enable_caching=False)
    twin.get_new_blocks(2)
    twin.free_blocks([1, 2])
    assert twin.state.free_queue == (1, 2, 3, 4)


def test_blocks_of_another_pool_are_forwarded_to_their_owner_after_the_local_ones():
    twin, other = Twin(4), Twin(4)
    twin.get_new_blocks(1)
    other.get_new_blocks(2)
    for mine, theirs in ((twin.spec, other.spec), (twin.ref, other.ref)):
        mine.free_blocks([theirs.ref(2), 1, theirs.ref(1)])
    assert twin.ref.abstract() == twin.spec.abstract()
    assert other.ref.abstract() == other.spec.abstract()
    assert twin.state.free_queue == (1, 2, 3)
    assert other.state.free_queue == (2, 1, 3)


# -- unpin_blocks and reuse watchers (§6.4) --------------------------------------------------


def test_unpinned_blocks_go_to_the_tail_even_without_a_key():
    twin = Twin(5)
    twin.get_new_blocks(2)
    twin.unpin_blocks([2, 1])
    assert twin.state.free_queue == (3, 4, 2, 1)
    assert twin.state.watchers == (2, 1)


def test_a_watcher_is_registered_even_when_the_block_keeps_other_holders():
    twin = Twin(4)
    twin.get_new_blocks(1)
    twin.touch([1])
    twin.unpin_blocks([1])
    assert twin.state.ref_cnt[1] == 1
    assert twin.state.watchers == (1,)
    assert 1 not in twin.state.free_queue


def test_re_registering_a_watcher_keeps_the_blocks_place_in_the_table():
    twin = Twin(5)
    twin.get_new_blocks(2)
    twin.touch([1])
    twin.unpin_blocks([1])
    twin.unpin_blocks([2])
    twin.unpin_blocks([1])
    assert twin.state.watchers == (1, 2)


def test_a_watcher_fires_once_when_its_block_is_reallocated():
    twin = Twin(3)
    twin.get_new_blocks(2)
    twin.unpin_blocks([1])
    twin.get_new_blocks(1)
    assert twin.fired["reference"] == [1]
    assert twin.state.watchers == ()
    twin.free_blocks([1])
    twin.get_new_blocks(1)
    assert twin.fired["reference"] == [1]


def test_touch_free_and_evict_neither_fire_nor_clear_watchers():
    twin, blocks = cached_twin(5, 1)
    twin.touch(blocks)
    twin.unpin_blocks(blocks)
    twin.free_blocks(blocks)
    twin.touch(blocks)
    twin.evict_blocks(blocks)
    assert twin.fired["reference"] == []
    assert twin.state.watchers == (1,)


def test_watchers_fire_in_pop_order():
    twin = Twin(4)
    twin.get_new_blocks(3)
    twin.unpin_blocks([3, 1])
    twin.free_blocks([2])
    twin.get_new_blocks(3)  # queue: 2, 3, 1
    assert twin.fired["reference"] == [3, 1]


# -- get_cached_block (§6.5) -----------------------------------------------------------------


def test_get_cached_block_returns_one_block_per_group_in_the_order_given():
    twin = Twin(6)
    request = request_with_hashes(1)
    twin.get_new_blocks(2)
    twin.cache_full_blocks(request, [1], 0, 1, 16, 0)
    twin.cache_full_blocks(request, [2], 0, 1, 16, 7)
    assert twin.get_cached_block(block_hash("r:0"), [7, 0]) == [2, 1]


def test_get_cached_block_misses_if_any_group_misses():
    twin, _ = cached_twin(4, 1)
    assert twin.get_cached_block(block_hash("r:0"), [0, 1]) is None


def test_get_cached_block_answers_with_the_earliest_cached_duplicate():
    twin = Twin(6)
    blocks = twin.get_new_blocks(2)
    twin.cache_full_blocks(request_with_hashes(1), [blocks[1]], 0, 1, 16, 0)
    twin.cache_full_blocks(request_with_hashes(1), [blocks[0]], 0, 1, 16, 0)
    assert twin.state.cache[key("r:0")] == (2, 1)
    assert twin.get_cached_block(block_hash("r:0"), [0]) == [2]


def test_get_cached_block_changes_nothing():
    twin, blocks = cached_twin(5, 2)
    twin.free_blocks(blocks)
    before = twin.ref.abstract()
    twin.get_cached_block(block_hash("r:1"), [0])
    assert twin.ref.abstract() == before
