"""What the reference pool's checks read of it: its object graph and two state views.

The invariant checks, the preconditions on objects and the contract checker are written
against this protocol rather than against :class:`~kvpool.reference.pool.ReferenceBlockPool`,
which imports them: the pool is built from its checks, not the other way round.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvpool.reference.block import KVCacheBlock
from kvpool.reference.free_queue import FreeKVCacheBlockQueue
from kvpool.reference.hash_map import BlockHashToBlockMap
from kvpool.shell.config import PoolConfig
from kvpool.spec.state import PoolState


class ReferenceParts(Protocol):
    """The reference pool as its checks see it."""

    config: PoolConfig
    enable_caching: bool
    hash_block_size: int
    blocks: list[KVCacheBlock]
    free_block_queue: FreeKVCacheBlockQueue
    cached_block_hash_to_block: BlockHashToBlockMap
    cached_block_hashes_by_block: dict[int, dict[bytes, None]]
    reuse_watcher_ids: dict[int, None]
    contract_checker: Any

    def watched_blocks(self) -> tuple[int, ...]:
        """The shell's watcher table, in order."""
        ...

    def state_with_queue(self, free_queue: tuple[int, ...]) -> PoolState:
        """The spec state with ``free_queue`` as the queue order."""
        ...

    def _core_state(self) -> PoolState:
        """The spec state of the pool."""
        ...
