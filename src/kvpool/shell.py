"""The public, id-based pool API, written once over a backend *core* (BEHAVIOUR.md §6).

A backend (spec, reference, fast) owns the bookkeeping: ref counts, queue, table, watcher
order, event numbering. Everything around it is the same for every backend and lives here:

* argument conversion — block ids come as ints, sequences or numpy integer arrays; blocks of
  another pool come as :class:`BlockRef`; a request's hashes come from ``request.block_hashes``;
* multi-pool routing of ``free_blocks`` (validated on every pool before any pool changes);
* reuse-watcher callbacks, metrics callbacks and event materialisation.

A subclass implements the ``_core_*`` methods; each validates its whole input (raising the
typed error of :mod:`kvpool.spec.preconditions`, same check order) before changing anything.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpool.errors import (
    ForeignBlock,
    InvalidArgument,
    InvalidBlockId,
    InvalidConfig,
    KvPoolError,
    WatcherError,
)
from kvpool.events import EventContext, EventLog, KVCacheEvent
from kvpool.spec.ops import usage_fraction  # usage: the spec is the one source of truth
from kvpool.spec.records import EventRecord
from kvpool.spec.state import NULL_BLOCK_ID, PoolState

logger = logging.getLogger("kvpool")

OnReuse = Callable[[int], None]
"""A reuse watcher: called with the block id when an unpinned block is reallocated.

Deviation from vLLM (docs/data-structures.md, "Watchers and events"): watchers run after the
operation has completed, so a watcher that queries the pool sees the block already
reallocated. The block's *memory* is still intact — nothing has written it before the caller
gets the ids back — which is all an asynchronous reader needs to know to stop reading.
"""


@dataclass(frozen=True)
class BlockRef:
    """A block named together with its owning pool (multi-pool routing, vLLM 0.30+).

    Plain ints always mean "a block of the pool I am calling". A ``BlockRef`` lets one
    ``free_blocks`` batch carry blocks of other pools: they are forwarded to their owner, in
    first-seen pool order, after the local blocks. Every other operation only takes local
    blocks and raises :class:`ForeignBlock` for a ``BlockRef`` to another pool.
    """

    pool: Any
    block_id: int


@dataclass(frozen=True)
class PoolConfig:
    """Constructor settings shared by every backend."""

    num_gpu_blocks: int
    enable_caching: bool = True
    hash_block_size: int = 16
    enable_kv_cache_events: bool = False
    num_hash_lookahead_tokens: int = 0
    medium: str = "GPU"
    use_int_block_hashes: bool = True

    def validate(self) -> None:
        n = self.num_gpu_blocks
        if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n <= 0:
            raise InvalidConfig(f"num_gpu_blocks must be an int > 0, got {n!r}")
        hbs = self.hash_block_size
        if not isinstance(hbs, numbers.Integral) or isinstance(hbs, bool) or hbs <= 0:
            raise InvalidConfig(f"hash_block_size must be an int > 0, got {hbs!r}")
        lookahead = self.num_hash_lookahead_tokens
        if not isinstance(lookahead, numbers.Integral) or lookahead < 0:
            raise InvalidConfig(f"num_hash_lookahead_tokens must be an int >= 0, got {lookahead!r}")


def as_block_id(value: object) -> int:
    """One block id as a Python int (numpy integers accepted, bools and floats rejected)."""
    if type(value) is int:  # the common case; the ABC check below costs ~1 µs per id
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise InvalidBlockId(f"block id must be an int, got {value!r}")
    return int(value)


def as_block_ids(blocks: Iterable[object]) -> tuple[int, ...]:
    """A batch of local block ids as a tuple of ints (numpy arrays take a fast path)."""
    if isinstance(blocks, np.ndarray):
        if blocks.ndim != 1 or blocks.dtype.kind not in "iu":
            raise InvalidBlockId(
                f"block id array must be 1-D integer, got {blocks.dtype} {blocks.shape}"
            )
        return tuple(blocks.tolist())
    return tuple(as_block_id(b) for b in blocks)


def as_group_id(value: object) -> object:
    """A numpy integer group id as a Python int; anything else is left for validation."""
    if isinstance(value, np.integer):
        return int(value)
    return value


def as_mask(mask: Sequence[object] | None) -> tuple[bool, ...] | None:
    if mask is None:
        return None
    return tuple(bool(m) for m in mask)


class PoolShell:
    """The public block-pool API over a backend core (see module docstring).

    Methods mirror vLLM's ``BlockPool`` with block ids instead of block objects.
    """

    backend_name = "abstract"

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int = 16,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str = "GPU",
        *,
        use_int_block_hashes: bool = True,
    ) -> None:
        config = PoolConfig(
            num_gpu_blocks=num_gpu_blocks,
            enable_caching=bool(enable_caching),
            hash_block_size=hash_block_size,
            enable_kv_cache_events=bool(enable_kv_cache_events),
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
            medium=medium,
            use_int_block_hashes=use_int_block_hashes,
        )
        config.validate()
        self.config = config
        self.num_gpu_blocks = int(num_gpu_blocks)
        self.enable_caching = config.enable_caching
        self.hash_block_size = int(hash_block_size)
        self.enable_kv_cache_events = config.enable_kv_cache_events
        self.metrics_collector = metrics_collector
        self.null_block = NULL_BLOCK_ID
        self._callbacks: dict[int, OnReuse] = {}
        self._events = EventLog(
            EventContext(
                medium=medium,
                hash_block_size=self.hash_block_size,
                num_lookahead_tokens=num_hash_lookahead_tokens,
                use_int_block_hashes=use_int_block_hashes,
            )
        )
        self._core_init(config)

    # -- backend core (subclasses) ------------------------------------------------------------

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

    # -- argument conversion ------------------------------------------------------------------

    def ref(self, block_id: int) -> BlockRef:
        """A reference to one of this pool's blocks, for another pool's ``free_blocks``."""
        return BlockRef(self, as_block_id(block_id))

    def _local_id(self, value: object) -> int:
        if isinstance(value, BlockRef):
            if value.pool is not self:
                raise ForeignBlock(
                    f"block {value.block_id} belongs to another pool ({value.pool!r})"
                )
            return as_block_id(value.block_id)
        return as_block_id(value)

    def _local_ids(self, blocks: Iterable[object]) -> tuple[int, ...]:
        if isinstance(blocks, np.ndarray):
            return as_block_ids(blocks)
        ids = tuple(blocks)
        if all(type(b) is int for b in ids):  # fast path: plain ints need no conversion
            return ids
        return tuple(self._local_id(b) for b in ids)

    # -- allocation and release ---------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` free blocks (front first), evicting their old keys. O(n)."""
        if isinstance(num_blocks, np.integer):
            num_blocks = int(num_blocks)
        ids, records, fired = self._core_get_new_blocks(num_blocks)
        ids = [int(b) for b in ids]
        self._events.record(records)
        collector = self.metrics_collector
        if collector is not None:
            for b in ids:
                if self.enable_caching:
                    collector.on_block_evicted(b)
                collector.on_block_allocated(b)
        self._fire_watchers(fired, result=ids)
        return ids

    def touch(self, blocks: Iterable[object]) -> None:
        """Take a reference on each block (prefix hit); free ones leave the queue. O(len)."""
        ids = self._local_ids(blocks)
        self._core_touch(ids)
        collector = self.metrics_collector
        if collector is not None:
            for b in ids:
                if b != NULL_BLOCK_ID:
                    collector.on_block_accessed(b)

    def free_blocks(self, ordered_blocks: Iterable[object]) -> None:
        """Release one reference per block, first = evict first; see the spec. O(len).

        Blocks of other pools (:class:`BlockRef`) are forwarded to their owners after the
        local ones. Every pool involved validates its part before any pool changes.
        """
        if isinstance(ordered_blocks, np.ndarray):
            local, foreign = as_block_ids(ordered_blocks), {}
        else:
            local_list: list[int] = []
            foreign: dict[Any, list[int]] = {}
            for b in ordered_blocks:
                if isinstance(b, BlockRef) and b.pool is not self:
                    foreign.setdefault(b.pool, []).append(as_block_id(b.block_id))
                else:
                    local_list.append(self._local_id(b))
            local = tuple(local_list)
        if foreign:
            for pool, ids in [(self, local), *((p, tuple(i)) for p, i in foreign.items())]:
                error = pool._core_check_free(ids)
                if error is not None:
                    raise error
        self._core_free(local)
        for pool, ids in foreign.items():
            pool.free_blocks(ids)

    def unpin_blocks(self, blocks: Iterable[object], on_reuse: OnReuse) -> None:
        """Release references that stay readable until reallocation; see the spec. O(len)."""
        if not callable(on_reuse):
            raise InvalidArgument(f"on_reuse must be callable, got {on_reuse!r}")
        ids = self._local_ids(blocks)
        self._core_unpin(ids)
        for b in ids:
            self._callbacks[b] = on_reuse  # an existing entry keeps its place

    def _fire_watchers(self, fired: Sequence[int], result: object = None) -> None:
        """Call the watchers of ``fired`` blocks in order; re-raise the first failure after.

        The operation has completed by then; its result rides on the error as ``.result`` so
        that nothing (e.g. freshly allocated blocks) is lost.
        """
        first_error: BaseException | None = None
        for b in fired:
            callback = self._callbacks.pop(int(b))
            try:
                callback(int(b))
            except Exception as exc:  # noqa: BLE001 - re-raised below as WatcherError
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            error = WatcherError(f"a reuse watcher raised: {first_error!r}")
            error.result = result
            raise error from first_error

    # -- the prefix cache -----------------------------------------------------------------

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[int] | None:
        """One block per group id for ``block_hash`` (in the order given), or ``None``. Pure."""
        group_ids = tuple(as_group_id(g) for g in kv_cache_group_ids)
        result = self._core_get_cached_block(block_hash, group_ids)
        return None if result is None else [int(b) for b in result]

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Iterable[object],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[object] | None = None,
    ) -> None:
        """Key the blocks at positions ``[num_cached_blocks, num_full_blocks)``; see the spec."""
        records = self._core_cache_full_blocks(
            request.block_hashes,
            self._local_ids(blocks),
            num_cached_blocks,
            num_full_blocks,
            block_size,
            as_group_id(kv_cache_group_id),
            as_mask(block_mask),
        )
        self._events.record(records, request)

    def cache_partial_block(
        self,
        request: Any,
        block: object,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> bytes | None:
        """Register a prefix entry ending inside ``block``; returns its key; see the spec."""
        key, records = self._core_cache_partial_block(
            request.block_hashes,
            self._local_id(block),
            num_tokens,
            as_group_id(kv_cache_group_id),
            block_size,
            bool(replace_existing_hashes),
        )
        self._events.record(records, request)
        return key

    def move_block_hashes(self, src_block: object, dst_block: object) -> None:
        """Hand every key of ``src_block`` to ``dst_block``; no events. See the spec."""
        self._core_move_block_hashes(self._local_id(src_block), self._local_id(dst_block))

    def evict_blocks(self, block_ids: Iterable[object]) -> None:
        """Drop the cache identity of each block; ref counts and queue untouched. O(len)."""
        ids = self._local_ids(block_ids)
        records = self._core_evict_blocks(ids)
        self._events.record(records)
        if self.metrics_collector is not None:
            for b in ids:
                self.metrics_collector.on_block_evicted(b)

    def reset_prefix_cache(self) -> bool:
        """Forget the whole prefix cache if nothing but the null block is held."""
        ok, records, fired = self._core_reset_prefix_cache()
        if not ok:
            held = self.num_gpu_blocks - self.get_num_free_blocks() - 1
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet", held
            )
        else:
            logger.info("Successfully reset prefix cache")
            self._events.record(records)
            if self.metrics_collector is not None:
                self.metrics_collector.reset()
            self._fire_watchers(fired, result=True)
        return ok

    def emit_cached_block_events(
        self, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None:
        """One ``BlockStored`` for positions ``0…n-1`` (full reporting); no state change."""
        records = self._core_emit_cached_block_events(
            request.block_hashes, num_cached_blocks, block_size, as_group_id(kv_cache_group_id)
        )
        self._events.record(records, request)

    # -- queries --------------------------------------------------------------------------

    def is_block_writable(self, block: object) -> bool:
        """Not null, ref_cnt 1, no key: the sole owner may write it in place."""
        return bool(self._core_is_block_writable(self._local_id(block)))

    def get_num_free_blocks(self) -> int:
        """Free blocks, cached candidates and unpinned blocks included. O(1)."""
        return int(self._core_num_free_blocks())

    def get_usage(self) -> float:
        """``1 - free / (N - 1)``: cached candidates count as free. O(1).

        The spec computes it (``spec.ops.usage_fraction``, under ``get_usage``'s contract).
        """
        return usage_fraction(self.num_gpu_blocks, self.get_num_free_blocks())

    @property
    def event_context(self) -> EventContext:
        """The settings events are built with (medium, hbs, int hashes); see ``replay``."""
        return self._events.ctx

    def take_events(self) -> list[KVCacheEvent]:
        """Hand over the pending events and start a new list (``[]`` if events are off)."""
        return self._events.take()

    def abstract(self) -> PoolAbstract:
        """Everything observable, as a comparable value: equal ⇔ the pools agree."""
        return PoolAbstract(self._core_state(), self._events.pending())

    def watched_blocks(self) -> tuple[int, ...]:
        """Blocks with a pending reuse watcher, in watcher-table order."""
        return tuple(self._callbacks)


@dataclass(frozen=True)
class PoolAbstract:
    """The canonical observable value of a pool: its core state and its pending events."""

    state: PoolState
    pending_events: tuple[KVCacheEvent, ...]
