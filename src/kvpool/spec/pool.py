"""``SpecPool``: the executable specification used as a backend (and as the oracle).

A thin mutable cell around an immutable :class:`~kvpool.spec.state.PoolState`: each call runs
the pure operation and keeps the new state. Slow (every operation copies tuples) and obviously
right, which is the point.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.errors import KvPoolError
from kvpool.shell import PoolConfig, PoolShell, StateObserver
from kvpool.spec import ops
from kvpool.spec import preconditions as pre
from kvpool.spec.records import EventRecord
from kvpool.spec.state import PoolState, initial_state


class SpecPool(PoolShell):
    """The spec as a block pool backend."""

    backend_name = "spec"
    # 64 bytes of tuples per block, twice: an operation builds the next state beside this one
    bytes_per_block = 128

    def _core_init(self, config: PoolConfig) -> None:
        self.state = initial_state(
            config.num_gpu_blocks,
            enable_caching=config.enable_caching,
            hash_block_size=config.hash_block_size,
            enable_events=config.enable_kv_cache_events,
        )

    def observe(self) -> StateObserver:
        """Per-block facts from the live state (O(1) to build)."""
        return StateObserver(self.state)

    def _apply(self, outcome: ops.Outcome) -> ops.Outcome:
        self.state = outcome.state
        return outcome

    def _core_get_new_blocks(self, n: int):
        out = self._apply(ops.get_new_blocks(self.state, n))
        return out.result, out.events, out.fired_watchers

    def _core_touch(self, ids: tuple[int, ...]) -> None:
        self._apply(ops.touch(self.state, ids))

    def _core_check_free(self, ids: tuple[int, ...]) -> KvPoolError | None:
        return pre.free_blocks_rejection(self.state, ids)

    def _core_free(self, ids: tuple[int, ...]) -> None:
        self._apply(ops.free_blocks(self.state, ids))

    def _core_unpin(self, ids: tuple[int, ...]) -> None:
        self._apply(ops.unpin_blocks(self.state, ids))

    def _core_get_cached_block(self, block_hash: bytes, group_ids: tuple[int, ...]):
        return ops.get_cached_block(self.state, block_hash, group_ids).result

    def _core_cache_full_blocks(
        self, hashes, ids, num_cached, num_full, block_size, group_id, mask
    ):
        out = ops.cache_full_blocks(
            self.state, tuple(hashes), ids, num_cached, num_full, block_size, group_id, mask
        )
        return self._apply(out).events

    def _core_cache_partial_block(
        self, hashes, block_id, num_tokens, group_id, block_size, replace_existing
    ):
        out = ops.cache_partial_block(
            self.state, tuple(hashes), block_id, num_tokens, group_id, block_size, replace_existing
        )
        self._apply(out)
        return out.result, out.events

    def _core_move_block_hashes(self, src: int, dst: int) -> None:
        self._apply(ops.move_block_hashes(self.state, src, dst))

    def _core_evict_blocks(self, ids: tuple[int, ...]) -> tuple[EventRecord, ...]:
        return self._apply(ops.evict_blocks(self.state, ids)).events

    def _core_reset_prefix_cache(self):
        out = self._apply(ops.reset_prefix_cache(self.state))
        return out.result, out.events, out.fired_watchers

    def _core_emit_cached_block_events(
        self, hashes: Sequence[bytes], num_cached, block_size, group_id
    ):
        out = ops.emit_cached_block_events(
            self.state, tuple(hashes), num_cached, block_size, group_id
        )
        return self._apply(out).events

    def _core_is_block_writable(self, block_id: int) -> bool:
        return bool(ops.is_block_writable(self.state, block_id).result)

    def _core_num_free_blocks(self) -> int:
        return ops.get_num_free_blocks(self.state)

    def _core_state(self) -> PoolState:
        return self.state
