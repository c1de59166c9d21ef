"""What the reference rejects: exactly :mod:`kvpool.spec.preconditions`, read from objects.

The spec's precondition functions read a handful of facts — per-block ref counts, primary
keys and token counts, secondary keys, the free count and the pool settings. :class:`StateView`
answers those reads from the live object graph, so the reference runs the spec's own checks:
one source of truth for what is rejected, with which error, in which order, at O(batch) cost
(nothing is copied). The one check of its own, :func:`unqueued_free_block`, guards against a
corruption only an object graph can have.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from kvpool.errors import KvPoolError, NotQueued
from kvpool.reference.free_queue import is_queued
from kvpool.reference.parts import ReferenceParts

if TYPE_CHECKING:
    from kvpool.reference.block import KVCacheBlock


class _PerBlock(Sequence):
    """``view[b]`` = one attribute of ``blocks[b]``: a read-only column of the object graph."""

    def __init__(self, blocks: list[KVCacheBlock], attribute: str) -> None:
        self._blocks = blocks
        self._attribute = attribute

    def __getitem__(self, block_id):  # type: ignore[override]
        return getattr(self._blocks[block_id], self._attribute)

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator:
        return (getattr(block, self._attribute) for block in self._blocks)


class _FreeCount:
    """Stands in for the spec's ``free_queue`` where only its length is read."""

    def __init__(self, pool: ReferenceParts) -> None:
        self._queue = pool.free_block_queue

    def __len__(self) -> int:
        return self._queue.num_free_blocks


class StateView:
    """The reads :mod:`kvpool.spec.preconditions` makes, answered by a reference pool."""

    def __init__(self, pool: ReferenceParts) -> None:
        self.num_blocks = len(pool.blocks)
        self.enable_caching = pool.enable_caching
        self.hash_block_size = pool.hash_block_size
        self.ref_cnt = _PerBlock(pool.blocks, "ref_cnt")
        self.primary_key = _PerBlock(pool.blocks, "block_hash")
        self.primary_tokens = _PerBlock(pool.blocks, "block_hash_num_tokens")
        self.secondary_keys = pool.cached_block_hashes_by_block
        self.free_queue = _FreeCount(pool)


def unqueued_free_block(pool: ReferenceParts, block_ids: Sequence[int]) -> KvPoolError | None:
    """A non-null block with ref 0 outside the free queue (``touch`` would corrupt the list).

    Cannot happen in a consistent pool (ref 0 ⇔ queued), so the spec has no such check; it is
    made here so that a corrupted pool fails before the batch is half touched.
    """
    for b in block_ids:
        block = pool.blocks[b]
        if not block.is_null and block.ref_cnt == 0 and not is_queued(block):
            return NotQueued(f"touch: block {b} has ref_cnt 0 but is not in the free queue")
    return None
