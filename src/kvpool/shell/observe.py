"""Reading a pool as values: per-block facts and the whole observable state.

A :class:`StateObserver` answers the per-block queries of :class:`kvpool.protocol.
BlockObserver` from a spec :class:`~kvpool.spec.state.PoolState`; a :class:`PoolAbstract` is
everything a pool shows, so two pools agree exactly when their abstracts are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.events import KVCacheEvent
from kvpool.shell.arguments import as_pool_block_ids
from kvpool.spec.state import PoolState


class StateObserver:
    """Per-block facts read from a spec :class:`PoolState` (the spec pool's own state, or a
    backend's projection of its bookkeeping)."""

    def __init__(self, state: PoolState) -> None:
        self.state = state

    def ref_cnts(self, block_ids: list[int]) -> list[int]:
        ref = self.state.ref_cnt
        return [ref[b] for b in block_ids]

    def key_tokens(self, block_id: int) -> int | None:
        return self.state.primary_tokens[block_id]

    def max_key_tokens(self, block_ids: Sequence[int]) -> int:
        tokens = self.state.primary_tokens
        ids = as_pool_block_ids(block_ids, self.state.num_blocks)
        return max((t for b in ids if (t := tokens[b]) is not None), default=0)

    def queue_front(self, n: int) -> list[int]:
        return list(self.state.free_queue[:n])


@dataclass(frozen=True)
class PoolAbstract:
    """The canonical observable value of a pool: its core state and its pending events."""

    state: PoolState
    pending_events: tuple[KVCacheEvent, ...]
