"""``FreeKVCacheBlockQueue``: the free blocks as an intrusive doubly linked list (BEHAVIOUR.md §4).

Front = next block to be allocated (and so evicted). The links are fields of the blocks
themselves and two sentinel blocks (id -1) sit before the front and after the tail, so every
operation is a few pointer writes: no node objects, no per-operation allocation beyond the
lists that are returned. That is what lets a Python linked list keep up with ``deque`` while
still supporting O(1) removal from the middle (a prefix hit takes a block out of the queue).

Membership is read from the links: a queued block has both links set, an unqueued block has
both cleared, and every removal path clears both. Unlike vLLM, every operation checks that
membership before changing anything (BEHAVIOUR.md §12): queueing a queued block raises
:class:`AlreadyQueued`, removing an unqueued one :class:`NotQueued`. A block linked into a
*different* queue also reads as queued; keeping blocks to their own pool is the pool's job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvpool.errors import AlreadyQueued, InvalidArgument, NoFreeBlocks, NotQueued
from kvpool.reference.block import KVCacheBlock

SENTINEL_ID = -1


def is_queued(block: KVCacheBlock) -> bool:
    """Whether ``block`` is linked into a queue (both links set). O(1)."""
    return block.prev_free_block is not None and block.next_free_block is not None


def _unlink_links(block: KVCacheBlock) -> None:
    block.prev_free_block = None
    block.next_free_block = None


class FreeKVCacheBlockQueue:
    """The free blocks, front first: a stack zone of uncached blocks and an LRU zone of cached ones.

    Operations, by purpose:

    * take from the front: :meth:`popleft` O(1), :meth:`popleft_n` O(n);
    * take from anywhere: :meth:`remove` O(1);
    * give back: :meth:`append` O(1) and :meth:`append_n` O(k) at the tail,
      :meth:`prepend_n` O(k) at the front;
    * read: ``num_free_blocks`` O(1), :meth:`get_all_free_blocks` O(N),
      :meth:`iter_blocks_after` O(remaining), :meth:`is_queued` O(1).
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Queue ``blocks`` in list order (the pool passes them by ascending id). O(N)."""
        self.num_free_blocks = 0
        self.fake_free_list_head = KVCacheBlock(SENTINEL_ID)
        self.fake_free_list_tail = KVCacheBlock(SENTINEL_ID)
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = self.fake_free_list_head
        self.append_n(blocks)

    # -- taking blocks ------------------------------------------------------------------------

    def popleft(self) -> KVCacheBlock:
        """Remove and return the front block. O(1).

        Raises :class:`NoFreeBlocks` (a ``ValueError``, vLLM's text) when the queue is empty.
        """
        first = self.fake_free_list_head.next_free_block
        assert first is not None, "the head sentinel always has a successor"
        if first is self.fake_free_list_tail:
            raise NoFreeBlocks("No free blocks available")
        self._unlink(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the first ``n`` blocks in queue order (``[]`` for 0). O(n).

        Raises :class:`InvalidArgument` if ``n < 0`` or ``n > num_free_blocks`` (vLLM asserts
        only the latter, after having changed the counter).
        """
        if n < 0 or n > self.num_free_blocks:
            raise InvalidArgument(
                f"popleft_n({n}) needs 0 <= n <= num_free_blocks ({self.num_free_blocks})"
            )
        popped: list[KVCacheBlock] = []
        curr = self.fake_free_list_head.next_free_block
        for _ in range(n):
            assert curr is not None
            after = curr.next_free_block
            _unlink_links(curr)
            popped.append(curr)
            curr = after
        # One splice for the whole run: the head now points at the first survivor.
        assert curr is not None
        self.fake_free_list_head.next_free_block = curr
        curr.prev_free_block = self.fake_free_list_head
        self.num_free_blocks -= n
        return popped

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it is (a prefix hit protects it from eviction). O(1).

        Raises :class:`NotQueued` if the block is not queued (sentinels included).
        """
        if not is_queued(block):
            raise NotQueued(f"remove() called on a block that is not queued: {block!r}")
        self._unlink(block)

    def _unlink(self, block: KVCacheBlock) -> None:
        prev_block, next_block = block.prev_free_block, block.next_free_block
        assert prev_block is not None and next_block is not None
        prev_block.next_free_block = next_block
        next_block.prev_free_block = prev_block
        _unlink_links(block)
        self.num_free_blocks -= 1

    # -- giving blocks back -------------------------------------------------------------------

    def append(self, block: KVCacheBlock) -> None:
        """Link ``block`` at the tail (evicted last). O(1).

        Raises :class:`AlreadyQueued` if it is queued already (vLLM corrupts the list).
        """
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise AlreadyQueued(f"append() called on a block that is already queued: {block!r}")
        last = self.fake_free_list_tail.prev_free_block
        assert last is not None, "the tail sentinel always has a predecessor"
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link ``blocks`` at the tail in list order (``blocks[-1]`` is evicted last). O(k).

        Raises :class:`AlreadyQueued`, queueing none of them, if any block is queued already
        or appears twice.
        """
        last = self.fake_free_list_tail.prev_free_block
        assert last is not None
        self._link_run(blocks, last, self.fake_free_list_tail, "append_n")

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link ``blocks`` after the head in list order (``blocks[0]`` becomes the front). O(k).

        A later ``prepend_n`` goes before an earlier one: freed uncached blocks are reused
        LIFO across calls (the most recently freed memory is the warmest). Raises
        :class:`AlreadyQueued`, queueing none of them, if any block is queued or repeated.
        """
        first = self.fake_free_list_head.next_free_block
        assert first is not None
        self._link_run(blocks, self.fake_free_list_head, first, "prepend_n")

    def _link_run(
        self,
        blocks: Sequence[KVCacheBlock],
        before: KVCacheBlock,
        after: KVCacheBlock,
        operation: str,
    ) -> None:
        """Splice ``blocks`` as one chain between the adjacent nodes ``before`` and ``after``.

        Each block is checked just before it is linked, so a repeat within the batch is seen
        as "already queued"; on failure the blocks linked so far are unlinked again (O(k), no
        allocation) and ``before``/``after`` are rejoined, leaving the queue as it was.
        """
        prev = before
        for i, block in enumerate(blocks):
            if block.prev_free_block is not None or block.next_free_block is not None:
                for linked in blocks[:i]:
                    _unlink_links(linked)
                before.next_free_block = after
                after.prev_free_block = before
                raise AlreadyQueued(f"{operation}() got a block that is already queued: {block!r}")
            block.prev_free_block = prev
            prev.next_free_block = block
            # A placeholder successor marks the block as linked, so a repeat later in the
            # batch is caught; it is overwritten by the next block or by ``after``.
            block.next_free_block = after
            prev = block
        prev.next_free_block = after
        after.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    # -- reading ------------------------------------------------------------------------------

    def is_queued(self, block: KVCacheBlock) -> bool:
        """Whether ``block`` is linked into a queue (read from its links). O(1)."""
        return is_queued(block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Every queued block, front first (a testing and state-conversion aid). O(N)."""
        return list(self.iter_blocks_after(None))

    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        """Lazily yield the queued blocks after ``cursor`` (front first if ``None``). O(remaining).

        A cursor that is not queued yields nothing. The queue must not change while the
        iterator is being consumed.
        """
        if cursor is None:
            curr = self.fake_free_list_head.next_free_block
        elif not is_queued(cursor):
            return
        else:
            curr = cursor.next_free_block
        tail = self.fake_free_list_tail
        while curr is not None and curr is not tail:
            yield curr
            curr = curr.next_free_block
