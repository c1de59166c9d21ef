"""The free queue as a tuple of block ids, front first (BEHAVIOUR.md §4).

The real queue is an intrusive doubly linked list; here it is a tuple, so each operation is
one obviously-correct line. Callers guarantee membership (these helpers check nothing):
``remove`` takes a queued block, ``append_n``/``prepend_n`` take unqueued, distinct blocks.
"""

from __future__ import annotations


def popleft_n(queue: tuple[int, ...], n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split off the first ``n`` blocks: ``(popped, rest)``. O(n)."""
    return queue[:n], queue[n:]


def remove(queue: tuple[int, ...], block_id: int) -> tuple[int, ...]:
    """The queue without ``block_id`` (unlinked from anywhere). O(1) in a linked list."""
    i = queue.index(block_id)
    return queue[:i] + queue[i + 1 :]


def append_n(queue: tuple[int, ...], blocks: tuple[int, ...]) -> tuple[int, ...]:
    """Link ``blocks`` at the tail, in list order (LRU end: evicted last)."""
    return queue + blocks


def prepend_n(queue: tuple[int, ...], blocks: tuple[int, ...]) -> tuple[int, ...]:
    """Link ``blocks`` right after the head, in list order (``blocks[0]`` becomes the front)."""
    return blocks + queue
