"""FreeKVCacheBlockQueue: the intrusive free list and its stricter checks (BEHAVIOUR.md §4, §12)."""

from __future__ import annotations

import pytest

from kvpool.errors import AlreadyQueued, InvalidArgument, KvPoolError, NoFreeBlocks, NotQueued
from kvpool.reference import FreeKVCacheBlockQueue, KVCacheBlock


def make_queue(n: int = 5) -> tuple[FreeKVCacheBlockQueue, list[KVCacheBlock]]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return FreeKVCacheBlockQueue(blocks), blocks


def ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in queue.get_all_free_blocks()]


def assert_links_sound(queue: FreeKVCacheBlockQueue, blocks: list[KVCacheBlock]) -> None:
    """Queued blocks have both links (and agree backwards), unqueued ones have none."""
    queued = queue.get_all_free_blocks()
    backward = []
    curr = queue.fake_free_list_tail.prev_free_block
    while curr is not queue.fake_free_list_head:
        backward.append(curr)
        curr = curr.prev_free_block
    assert backward[::-1] == queued
    assert queue.num_free_blocks == len(queued)
    for block in blocks:
        linked = block.prev_free_block is not None, block.next_free_block is not None
        assert linked == ((True, True) if block in queued else (False, False)), block


def test_a_new_queue_holds_the_blocks_in_list_order():
    queue, blocks = make_queue(4)
    assert ids(queue) == [0, 1, 2, 3]
    assert queue.num_free_blocks == 4
    assert_links_sound(queue, blocks)


def test_sentinels_have_id_minus_one_and_are_never_returned():
    queue, blocks = make_queue(2)
    assert queue.fake_free_list_head.block_id == -1
    assert queue.fake_free_list_tail.block_id == -1
    assert queue.popleft_n(2) == blocks
    assert queue.get_all_free_blocks() == []
    with pytest.raises(NoFreeBlocks):
        queue.popleft()


def test_sentinels_cannot_be_removed_or_queued_again():
    queue, _ = make_queue(2)
    with pytest.raises(NotQueued):
        queue.remove(queue.fake_free_list_head)  # the head has no predecessor
    with pytest.raises(AlreadyQueued):
        queue.append(queue.fake_free_list_tail)
    assert ids(queue) == [0, 1]


def test_popleft_returns_the_front_block_with_both_links_cleared():
    queue, blocks = make_queue(3)
    block = queue.popleft()
    assert block is blocks[0]
    assert ids(queue) == [1, 2]
    assert_links_sound(queue, blocks)


def test_popleft_on_an_empty_queue_raises_vllms_value_error():
    queue, _ = make_queue(0)
    with pytest.raises(ValueError, match="No free blocks available") as info:
        queue.popleft()
    assert isinstance(info.value, NoFreeBlocks)


def test_popleft_n_removes_the_first_n_in_queue_order():
    queue, blocks = make_queue(5)
    assert [b.block_id for b in queue.popleft_n(3)] == [0, 1, 2]
    assert ids(queue) == [3, 4]
    assert_links_sound(queue, blocks)


def test_popleft_n_of_zero_returns_an_empty_list():
    queue, _ = make_queue(3)
    assert queue.popleft_n(0) == []
    assert ids(queue) == [0, 1, 2]


def test_popleft_n_of_everything_empties_the_queue():
    queue, blocks = make_queue(3)
    assert queue.popleft_n(3) == blocks
    assert queue.num_free_blocks == 0
    assert_links_sound(queue, blocks)


@pytest.mark.parametrize("n", [4, -1])
def test_popleft_n_beyond_the_count_or_negative_raises_invalid_argument_and_changes_nothing(n):
    queue, blocks = make_queue(3)
    with pytest.raises(InvalidArgument) as info:
        queue.popleft_n(n)
    assert isinstance(info.value, ValueError)
    assert ids(queue) == [0, 1, 2]
    assert_links_sound(queue, blocks)


def test_remove_unlinks_a_block_from_the_middle():
    queue, blocks = make_queue(4)
    queue.remove(blocks[2])
    assert ids(queue) == [0, 1, 3]
    assert_links_sound(queue, blocks)


def test_removing_an_unqueued_block_raises_not_queued_and_changes_nothing():
    queue, blocks = make_queue(3)
    queue.remove(blocks[1])
    with pytest.raises(NotQueued) as info:
        queue.remove(blocks[1])
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, KvPoolError)
    assert ids(queue) == [0, 2]
    assert_links_sound(queue, blocks)


def test_append_links_at_the_tail():
    queue, blocks = make_queue(3)
    queue.remove(blocks[0])
    queue.append(blocks[0])
    assert ids(queue) == [1, 2, 0]
    assert_links_sound(queue, blocks)


def test_appending_a_queued_block_raises_already_queued_and_changes_nothing():
    queue, blocks = make_queue(3)
    with pytest.raises(AlreadyQueued) as info:
        queue.append(blocks[1])
    assert isinstance(info.value, RuntimeError)
    assert ids(queue) == [0, 1, 2]
    assert_links_sound(queue, blocks)


def test_append_n_links_the_batch_at_the_tail_in_list_order():
    queue, blocks = make_queue(5)
    taken = queue.popleft_n(3)
    queue.append_n([taken[2], taken[0]])
    assert ids(queue) == [3, 4, 2, 0]
    assert_links_sound(queue, blocks)


def test_prepend_n_puts_the_batch_at_the_front_with_its_first_block_first():
    queue, blocks = make_queue(5)
    taken = queue.popleft_n(3)
    queue.prepend_n([taken[2], taken[0]])
    assert ids(queue) == [2, 0, 3, 4]
    assert_links_sound(queue, blocks)


def test_a_later_prepend_goes_before_an_earlier_one():
    queue, blocks = make_queue(5)
    first, second = queue.popleft_n(2)
    queue.prepend_n([first])
    queue.prepend_n([second])
    assert ids(queue) == [1, 0, 2, 3, 4]
    assert_links_sound(queue, blocks)


def test_append_n_and_prepend_n_of_an_empty_batch_are_no_ops():
    queue, blocks = make_queue(2)
    queue.append_n([])
    queue.prepend_n([])
    assert ids(queue) == [0, 1]
    assert_links_sound(queue, blocks)


def test_batches_can_refill_an_empty_queue():
    queue, blocks = make_queue(3)
    taken = queue.popleft_n(3)
    queue.prepend_n(taken[:1])
    queue.append_n(taken[1:])
    assert ids(queue) == [0, 1, 2]
    assert_links_sound(queue, blocks)


@pytest.mark.parametrize("operation", ["append_n", "prepend_n"])
def test_batch_queueing_of_a_queued_block_raises_already_queued_and_queues_none(operation):
    queue, blocks = make_queue(5)
    taken = queue.popleft_n(2)
    with pytest.raises(AlreadyQueued):
        getattr(queue, operation)([taken[0], blocks[3], taken[1]])
    assert ids(queue) == [2, 3, 4]
    assert_links_sound(queue, blocks)


@pytest.mark.parametrize("operation", ["append_n", "prepend_n"])
def test_a_block_repeated_within_a_batch_raises_already_queued_and_queues_none(operation):
    queue, blocks = make_queue(5)
    taken = queue.popleft_n(3)
    with pytest.raises(AlreadyQueued):
        getattr(queue, operation)([taken[0], taken[1], taken[0], taken[2]])
    assert ids(queue) == [3, 4]
    assert_links_sound(queue, blocks)


def test_get_all_free_blocks_follows_queue_order_not_id_order():
    queue, blocks = make_queue(4)
    queue.remove(blocks[1])
    queue.append(blocks[1])
    assert ids(queue) == [0, 2, 3, 1]


def test_iter_blocks_after_none_starts_at_the_front():
    queue, _ = make_queue(3)
    assert [b.block_id for b in queue.iter_blocks_after(None)] == [0, 1, 2]


def test_iter_blocks_after_a_cursor_yields_only_the_blocks_behind_it():
    queue, blocks = make_queue(4)
    assert [b.block_id for b in queue.iter_blocks_after(blocks[1])] == [2, 3]
    assert list(queue.iter_blocks_after(blocks[3])) == []


def test_iter_blocks_after_an_unqueued_cursor_yields_nothing():
    queue, blocks = make_queue(3)
    queue.remove(blocks[0])
    assert list(queue.iter_blocks_after(blocks[0])) == []


def test_iter_blocks_after_is_lazy():
    queue, blocks = make_queue(3)
    iterator = queue.iter_blocks_after(None)
    assert next(iterator) is blocks[0]
    assert queue.num_free_blocks == 3


def test_is_queued_reads_membership_from_the_links():
    queue, blocks = make_queue(2)
    assert queue.is_queued(blocks[0])
    queue.remove(blocks[0])
    assert not queue.is_queued(blocks[0])
