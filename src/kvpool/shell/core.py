"""What a backend implements: the ``_core_*`` methods the shell calls.

A backend (spec, reference, fast) owns the bookkeeping — ref counts, free queue, hash table,
watcher order, event records. Each core method validates its whole input, raising the typed
error of :mod:`kvpool.spec.preconditions` in the spec's check order, before it changes
anything; the shell (:class:`kvpool.shell.PoolShell`) converts arguments before and delivers
events and callbacks after.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.errors import KvPoolError
from kvpool.shell.config import PoolConfig
from kvpool.spec.records import EventRecord
from kvpool.spec.state import PoolState


class PoolCore:
    """The backend interface; every method raises ``NotImplementedError`` here."""


    def _core_init(self, config: PoolConfig) -> None:
        raise NotImplementedError

    def _core_get_new_blocks(
        self, n: int
    ) -> tuple[Sequence[int], tuple[EventRecord, ...], tuple[int, ...]]:
        raise NotImplementedError

    def _core_touch(self, ids: tuple[int, ...]) -> None:
        raise NotImplementedError

    def _core_check_free(self, ids: tuple[int, ...]) -> KvPoolError | None:
        raise NotImplementedError

    def _core_free(self, ids: tuple[int, ...]) -> None:
        raise NotImplementedError

    def _core_unpin(self, ids: tuple[int, ...]) -> None:
        raise NotImplementedError

    def _core_get_cached_block(
        self, block_hash: bytes, group_ids: tuple[int, ...]
    ) -> Sequence[int] | None:
        raise NotImplementedError

    def _core_cache_full_blocks(
        self,
        hashes: Sequence[bytes],
        ids: tuple[int, ...],
        num_cached: int,
        num_full: int,
        block_size: int,
        group_id: int,
        mask: tuple[bool, ...] | None,
    ) -> tuple[EventRecord, ...]:
        raise NotImplementedError

    def _core_cache_partial_block(
        self,
        hashes: Sequence[bytes],
        block_id: int,
        num_tokens: int,
        group_id: int,
        block_size: int,
        replace_existing: bool,
    ) -> tuple[bytes | None, tuple[EventRecord, ...]]:
        raise NotImplementedError

    def _core_move_block_hashes(self, src: int, dst: int) -> None:
        raise NotImplementedError

    def _core_evict_blocks(self, ids: tuple[int, ...]) -> tuple[EventRecord, ...]:
        raise NotImplementedError

    def _core_reset_prefix_cache(self) -> tuple[bool, tuple[EventRecord, ...], tuple[int, ...]]:
        raise NotImplementedError

    def _core_emit_cached_block_events(
        self, hashes: Sequence[bytes], num_cached: int, block_size: int, group_id: int
    ) -> tuple[EventRecord, ...]:
        raise NotImplementedError

    def _core_is_block_writable(self, block_id: int) -> bool:
        raise NotImplementedError

    def _core_num_free_blocks(self) -> int:
        raise NotImplementedError

    def _core_state(self) -> PoolState:
        """The core's bookkeeping as the spec's state value (for ``abstract``)."""
        raise NotImplementedError
