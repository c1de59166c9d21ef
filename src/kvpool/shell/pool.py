"""The public, id-based pool API, written once over a backend core (BEHAVIOUR.md §6).

:class:`PoolShell` is what every backend's users call. It converts arguments
(:mod:`~kvpool.shell.arguments`), routes the blocks of other pools in ``free_blocks``
(validated on every pool before any pool changes), runs the cache writes' early checks
(:mod:`~kvpool.shell.cache_checks`), calls the backend's core (:mod:`~kvpool.shell.core`),
numbers and materialises events, and delivers callbacks (:mod:`~kvpool.shell.callbacks`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from kvpool.errors import ForeignBlock, InvalidArgument
from kvpool.events import (
    EventBuilder,
    EventContext,
    EventLog,
    KVCacheEvent,
    materialize,
    partial_stored_rejection,
    stored_rejection,
)
from kvpool.memory import check_pool_fits
from kvpool.protocol import BlockObserver
from kvpool.shell.arguments import (
    BlockRef,
    as_block_id,
    as_block_ids,
    as_group_id,
    as_group_ids,
    as_mask,
    candidate_table,
    request_block_hashes,
)
from kvpool.shell.cache_checks import hashes_rejection, reportable_rejection
from kvpool.shell.callbacks import CallbackDelivery, OnReuse
from kvpool.shell.config import PoolConfig, check_metrics_collector
from kvpool.shell.core import PoolCore
from kvpool.shell.dims import dims, hbs_dims
from kvpool.shell.observe import PoolAbstract, StateObserver
from kvpool.spec import preconditions as pre
from kvpool.spec.ops import usage_fraction  # usage: the spec is the one source of truth
from kvpool.spec.state import NULL_BLOCK_ID

logger = logging.getLogger("kvpool")


class PoolShell(PoolCore, CallbackDelivery):
    """The public block-pool API over a backend core (see module docstring).

    Methods mirror vLLM's ``BlockPool`` with block ids instead of block objects.
    """

    backend_name = "abstract"
    bytes_per_block: ClassVar[int] = 0
    """Memory one block costs to build and run this backend (an estimate, checked before
    building: :func:`kvpool.memory.check_pool_fits`)."""

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
            enable_caching=enable_caching,
            hash_block_size=hash_block_size,
            enable_kv_cache_events=enable_kv_cache_events,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
            medium=medium,
            use_int_block_hashes=use_int_block_hashes,
        )
        config.validate()
        check_metrics_collector(metrics_collector)
        check_pool_fits(self.backend_name, int(num_gpu_blocks), self.bytes_per_block)
        config = PoolConfig(
            num_gpu_blocks=int(num_gpu_blocks),
            enable_caching=bool(enable_caching),
            hash_block_size=int(hash_block_size),
            enable_kv_cache_events=bool(enable_kv_cache_events),
            num_hash_lookahead_tokens=int(num_hash_lookahead_tokens),
            medium=medium,
            use_int_block_hashes=bool(use_int_block_hashes),
        )
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
                num_lookahead_tokens=config.num_hash_lookahead_tokens,
                use_int_block_hashes=config.use_int_block_hashes,
            )
        )
        self._core_init(config)

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
        ids: tuple[Any, ...] = tuple(blocks)
        if all(type(b) is int for b in ids):  # fast path: plain ints need no conversion
            return ids
        return tuple(self._local_id(b) for b in ids)

    # -- allocation and release ---------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` free blocks (front first), evicting their old keys. O(n)."""
        self._refuse_reentry("get_new_blocks")
        if isinstance(num_blocks, np.integer):
            num_blocks = int(num_blocks)
        ids, records, fired = self._core_get_new_blocks(num_blocks)
        ids = [int(b) for b in ids]
        self._events.record(records)
        metrics: list[tuple[str, tuple[object, ...]]] = []
        if self.metrics_collector is not None:
            for b in ids:
                if self.enable_caching:
                    metrics.append(("on_block_evicted", (b,)))
                metrics.append(("on_block_allocated", (b,)))
        if metrics or fired:
            self._deliver(metrics, fired, result=ids)
        return ids

    def touch(self, blocks: Iterable[object]) -> None:
        """Take a reference on each block (prefix hit); free ones leave the queue. O(len)."""
        self._refuse_reentry("touch")
        ids = self._local_ids(blocks)
        self._core_touch(ids)
        if self.metrics_collector is not None:
            self._deliver([("on_block_accessed", (b,)) for b in ids if b != NULL_BLOCK_ID], ())

    def free_blocks(self, ordered_blocks: Iterable[object]) -> None:
        """Release one reference per block, first = evict first; see the spec. O(len).

        Blocks of other pools (:class:`BlockRef`) are forwarded to their owners after the
        local ones. Every pool involved validates its part before any pool changes.
        """
        self._refuse_reentry("free_blocks")
        foreign: dict[Any, list[int]] = {}
        if isinstance(ordered_blocks, np.ndarray):
            local = as_block_ids(ordered_blocks)
        else:
            local_list: list[int] = []
            for b in ordered_blocks:
                if isinstance(b, BlockRef) and b.pool is not self:
                    if not isinstance(b.pool, PoolShell):
                        raise ForeignBlock(
                            f"BlockRef({b.pool!r}, {b.block_id!r}) does not name a kvpool pool"
                        )
                    foreign.setdefault(b.pool, []).append(as_block_id(b.block_id))
                else:
                    local_list.append(self._local_id(b))
            local = tuple(local_list)
        if foreign:
            for pool, ids in [(self, local), *((p, tuple(i)) for p, i in foreign.items())]:
                pool._refuse_reentry("free_blocks")
                error = pool._core_check_free(ids)
                if error is not None:
                    raise error
        self._core_free(local)
        for pool, theirs in foreign.items():
            pool.free_blocks(theirs)

    def unpin_blocks(self, blocks: Iterable[object], on_reuse: OnReuse) -> None:
        """Release references that stay readable until reallocation; see the spec. O(len)."""
        self._refuse_reentry("unpin_blocks")
        if not callable(on_reuse):
            raise InvalidArgument(f"on_reuse must be callable, got {on_reuse!r}")
        ids = self._local_ids(blocks)
        self._core_unpin(ids)
        for b in ids:
            self._callbacks[b] = on_reuse  # an existing entry keeps its place

    # -- the prefix cache -----------------------------------------------------------------

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[int] | None:
        """One block per group id for ``block_hash`` (in the order given), or ``None``. Pure."""
        group_ids = as_group_ids(kv_cache_group_ids)
        result = self._core_get_cached_block(block_hash, group_ids)
        return None if result is None else [int(b) for b in result]

    def check_hashes(self, hashes: Sequence[object], table_len: int, num_cached: object,
                     num_full: object, block_size: object, group_id: object,
                     mask: tuple[bool, ...] | None) -> None:
        """Raise :func:`~kvpool.shell.cache_checks.hashes_rejection`'s error, if any."""
        error = hashes_rejection(self.enable_caching, self.hash_block_size, hashes, table_len,
                                 num_cached, num_full, block_size, group_id, mask)
        if error is not None:
            raise error

    def check_reportable(self, request: Any, hashes: Sequence[object], table_len: int,
                         num_cached: object, num_full: object, block_size: object,
                         group_id: object, mask: tuple[bool, ...] | None) -> None:
        """With events on: raise :func:`~kvpool.shell.cache_checks.reportable_rejection`'s
        error, if any, before the pool moves."""
        error = reportable_rejection(self._events.ctx, request, self.enable_caching,
                                     self.hash_block_size, hashes, table_len, num_cached,
                                     num_full, block_size, group_id, mask, self._events.build)
        if error is not None:
            raise error

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
        self._refuse_reentry("cache_full_blocks")
        hashes = request_block_hashes(request)
        ids = candidate_table(self._local_ids, blocks, num_cached_blocks, num_full_blocks)
        group_id = as_group_id(kv_cache_group_id)
        mask = as_mask(block_mask)
        self.check_hashes(hashes, len(ids), num_cached_blocks, num_full_blocks, block_size,
                          group_id, mask)
        if self.enable_kv_cache_events:
            self.check_reportable(request, hashes, len(ids), num_cached_blocks,
                                  num_full_blocks, block_size, group_id, mask)
        records = self._core_cache_full_blocks(
            hashes, ids, num_cached_blocks, num_full_blocks, block_size, group_id, mask
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
        self._refuse_reentry("cache_partial_block")
        hashes = request_block_hashes(request)
        block_id = self._local_id(block)
        group_id = as_group_id(kv_cache_group_id)
        view = dims(self)
        hbs = self.hash_block_size
        if (self.enable_caching and NULL_BLOCK_ID < block_id < self.num_gpu_blocks
                and not pre.bad_group_id(group_id) and not pre.bad_block_size(view, block_size)
                and pre.is_count(num_tokens) and num_tokens % hbs == 0
                and 0 < num_tokens // hbs <= len(hashes)):
            # Every argument check passes: the hash read must be bytes (spec order).
            error = pre.bad_block_hashes(hashes, num_tokens // hbs - 1, num_tokens // hbs, 1)
            if error is not None:
                raise error
        if self.enable_kv_cache_events:
            error = partial_stored_rejection(request, self._events.ctx, hashes, num_tokens,
                                             group_id, self._events.build)
            if error is not None:
                raise error
        key, records = self._core_cache_partial_block(
            hashes, block_id, num_tokens, group_id, block_size, bool(replace_existing_hashes),
        )
        self._events.record(records, request)
        return key

    def move_block_hashes(self, src_block: object, dst_block: object) -> None:
        """Hand every key of ``src_block`` to ``dst_block``; no events. See the spec."""
        self._refuse_reentry("move_block_hashes")
        self._core_move_block_hashes(self._local_id(src_block), self._local_id(dst_block))

    def evict_blocks(self, block_ids: Iterable[object]) -> None:
        """Drop the cache identity of each block; ref counts and queue untouched. O(len)."""
        self._refuse_reentry("evict_blocks")
        ids = self._local_ids(block_ids)
        records = self._core_evict_blocks(ids)
        self._events.record(records)
        if self.metrics_collector is not None:
            self._deliver([("on_block_evicted", (b,)) for b in ids], ())

    def reset_prefix_cache(self) -> bool:
        """Forget the whole prefix cache if nothing but the null block is held."""
        self._refuse_reentry("reset_prefix_cache")
        ok, records, fired = self._core_reset_prefix_cache()
        if not ok:
            held = self.num_gpu_blocks - self.get_num_free_blocks() - 1
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet", held
            )
        else:
            logger.info("Successfully reset prefix cache")
            self._events.record(records)
            metrics = [("reset", ())] if self.metrics_collector is not None else []
            if metrics or fired:
                self._deliver(metrics, fired, result=True)
        return ok

    def emit_cached_block_events(
        self, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None:
        """One ``BlockStored`` for positions ``0…n-1`` (full reporting); no state change."""
        self._refuse_reentry("emit_cached_block_events")
        hashes = request_block_hashes(request)
        group_id = as_group_id(kv_cache_group_id)
        if self.enable_kv_cache_events:
            error = pre.emit_cached_block_events_rejection(
                hbs_dims(self.hash_block_size), hashes, num_cached_blocks, block_size, group_id
            )
            if error is None and num_cached_blocks:
                ratio = block_size // self.hash_block_size
                error = pre.bad_block_hashes(hashes, 0, num_cached_blocks, ratio) or (
                    stored_rejection(request, self._events.ctx, hashes, 0, num_cached_blocks,
                                     block_size, group_id, self._events.build)
                )
                if error is not None:
                    raise error
        records = self._core_emit_cached_block_events(
            hashes, num_cached_blocks, block_size, group_id
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

    @property
    def event_builder(self) -> EventBuilder:
        """What builds this pool's events (:meth:`use_event_builder`)."""
        return self._events.build

    def use_event_builder(self, build: EventBuilder | None) -> None:
        """Build this pool's events with ``build(record, request, ctx)`` from now on
        (``None``: kvpool's own, :func:`kvpool.events.materialize`). For an owner that hands
        the events to code expecting other classes — the vLLM drop-in builds vLLM's event
        objects directly, not kvpool's and then a copy. Pending events are kept as built.

        ``build`` must only build (publish from :meth:`take_events`): the fast pool builds a
        cache write's ``BlockStored`` before the write, so a write that is then refused (an
        invalid block, say) has had its event built and dropped; an exception from ``build``
        there refuses the write with :class:`~kvpool.errors.InvalidArgument`, before the
        pool moves."""
        if build is not None and not callable(build):
            raise InvalidArgument(f"an event builder must be callable, got {build!r}")
        self._events.build = build or materialize

    def take_events(self) -> list[KVCacheEvent]:
        """Hand over the pending events and start a new list (``[]`` if events are off)."""
        return self._events.take()

    def abstract(self) -> PoolAbstract:
        """Everything observable, as a comparable value: equal ⇔ the pools agree."""
        return PoolAbstract(self._core_state(), self._events.pending())

    def observe(self) -> BlockObserver:
        """Per-block facts (:class:`kvpool.protocol.BlockObserver`). This default reads the
        core's spec state (O(N) to build); backends override it with an O(1) reader."""
        return StateObserver(self._core_state())
