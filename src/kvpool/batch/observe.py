"""Read-only facts about a pool's blocks, for the up-front checks of a batch composition.

Contract: an :class:`Observer` reads, never changes, and answers from the pool's state at the
time of the read. The protocol has no verb for a block's ref count or key length (vLLM's
managers read them off the block objects), so :func:`observe` finds the cheapest faithful
source: the pool's own ``observe()`` (the fast pool), the spec pool's state, the reference
pool's block objects, and for any other pool its ``abstract()`` (O(N), once per call).
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Protocol

from kvpool.spec.state import PoolState


class Observer(Protocol):
    """Facts about one pool's blocks (the null block is never asked about)."""

    def ref_cnts(self, block_ids: list[int]) -> list[int]:
        """The ref count of each block."""

    def key_tokens(self, block_id: int) -> int | None:
        """Tokens covered by the block's primary key, ``None`` without a key."""

    def queue_front(self, n: int) -> list[int]:
        """The first ``n`` blocks of the free queue (the next ``get_new_blocks(n)``)."""


class StateObserver:
    """Facts read from a spec :class:`PoolState` (the spec pool's own, or an ``abstract()``)."""

    def __init__(self, state: PoolState) -> None:
        self.state = state

    def ref_cnts(self, block_ids: list[int]) -> list[int]:
        ref = self.state.ref_cnt
        return [ref[b] for b in block_ids]

    def key_tokens(self, block_id: int) -> int | None:
        return self.state.primary_tokens[block_id]

    def queue_front(self, n: int) -> list[int]:
        return list(self.state.free_queue[:n])


class ReferenceObserver:
    """Facts read from the reference pool's block objects, as vLLM's managers read them."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.blocks = pool.blocks

    def ref_cnts(self, block_ids: list[int]) -> list[int]:
        blocks = self.blocks
        return [blocks[b].ref_cnt for b in block_ids]

    def key_tokens(self, block_id: int) -> int | None:
        return self.blocks[block_id].block_hash_num_tokens

    def queue_front(self, n: int) -> list[int]:
        queued = self.pool.free_block_queue.iter_blocks_after(None)
        return [b.block_id for b in islice(queued, n)]


def observe(pool: Any) -> Observer:
    """An :class:`Observer` of ``pool`` (see the module docstring)."""
    own = getattr(pool, "observe", None)
    if own is not None:
        return own()
    spec_pool, reference_pool = _backend_classes()
    if isinstance(pool, spec_pool):
        return StateObserver(pool.state)
    if isinstance(pool, reference_pool):
        return ReferenceObserver(pool)
    return StateObserver(pool.abstract().state)


_CLASSES: tuple[Any, Any] | None = None


def _backend_classes() -> tuple[Any, Any]:
    """The spec and reference pool classes (imported on first use, so that importing
    :mod:`kvpool.batch` loads no backend)."""
    global _CLASSES
    if _CLASSES is None:
        from kvpool.reference.pool import ReferenceBlockPool
        from kvpool.spec.pool import SpecPool

        _CLASSES = (SpecPool, ReferenceBlockPool)
    return _CLASSES


__all__ = ["Observer", "ReferenceObserver", "StateObserver", "observe"]
