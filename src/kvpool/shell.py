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
from typing import Any, ClassVar, cast

import numpy as np

from kvpool.errors import (
    CallbackError,
    ForeignBlock,
    InvalidArgument,
    InvalidBlockId,
    InvalidConfig,
    KvPoolError,
    MetricsCollectorError,
    ReentrantCall,
    WatcherError,
)
from kvpool.events import (
    EventContext,
    EventLog,
    KVCacheEvent,
    partial_stored_rejection,
    stored_rejection,
)
from kvpool.hash_list import BlockHashList
from kvpool.memory import check_pool_fits
from kvpool.protocol import BlockObserver
from kvpool.spec import preconditions as pre
from kvpool.spec.ops import usage_fraction  # usage: the spec is the one source of truth
from kvpool.spec.records import EventRecord
from kvpool.spec.state import NULL_BLOCK_ID, PoolState, PoolView

logger = logging.getLogger("kvpool")

OnReuse = Callable[[int], None]
"""A reuse watcher: called with the block id when an unpinned block is reallocated.

Deviation from vLLM (docs/data-structures.md, "Watchers and events"): watchers run after the
operation has completed, so a watcher that queries the pool sees the block already
reallocated. The block's *memory* is still intact — nothing has written it before the caller
gets the ids back — which is all an asynchronous reader needs to know to stop reading.

Re-entrancy (docs/api.md, "Callbacks"): while a pool delivers its callbacks (reuse watchers,
metrics collector) it answers queries, but every state-changing method raises
:class:`~kvpool.errors.ReentrantCall` before changing anything.
"""

METRICS_METHODS = ("on_block_allocated", "on_block_accessed", "on_block_evicted", "reset")
"""What a ``metrics_collector`` must offer (checked at construction)."""



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
        """Raise :class:`InvalidConfig` for the first setting of the wrong type or range."""
        _check_count("num_gpu_blocks", self.num_gpu_blocks, minimum=1)
        _check_count("hash_block_size", self.hash_block_size, minimum=1)
        _check_count("num_hash_lookahead_tokens", self.num_hash_lookahead_tokens, minimum=0)
        for name in ("enable_caching", "enable_kv_cache_events", "use_int_block_hashes"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                # A string "False" is truthy: accepting it would silently turn a feature on.
                raise InvalidConfig(f"{name} must be a bool, got {value!r}")
        if not isinstance(self.medium, str):
            raise InvalidConfig(f"medium must be a str, got {self.medium!r}")


def _check_count(name: str, value: object, *, minimum: int) -> None:
    if (
        not isinstance(value, numbers.Integral)
        or isinstance(value, (bool, np.bool_))
        or value < minimum
    ):
        raise InvalidConfig(f"{name} must be an int >= {minimum}, got {value!r}")


def check_metrics_collector(collector: object) -> None:
    """``None`` or an object with the four callable :data:`METRICS_METHODS`; else
    :class:`InvalidConfig` (a wrong object would fail only at the first allocation)."""
    if collector is None:
        return
    missing = [m for m in METRICS_METHODS if not callable(getattr(collector, m, None))]
    if missing:
        raise InvalidConfig(
            f"metrics_collector {collector!r} lacks callable {', '.join(missing)} "
            "(see kvpool.MetricsCollector)"
        )


def request_block_hashes(request: object) -> Sequence[bytes]:
    """``request.block_hashes``, which must be a sequence (a list or tuple; a one-shot
    iterator would be consumed by the first backend that reads it). Entries are checked
    where they are read (:func:`kvpool.spec.preconditions.bad_block_hashes`)."""
    try:
        hashes = request.block_hashes  # type: ignore[attr-defined]
    except AttributeError:
        raise InvalidArgument(
            f"request {request!r} has no block_hashes (a list of bytes)"
        ) from None
    if type(hashes) is list or type(hashes) is BlockHashList or type(hashes) is tuple:
        return hashes
    if not isinstance(hashes, Sequence) or isinstance(hashes, (str, bytes, bytearray)):
        raise InvalidArgument(
            f"request.block_hashes must be a list of bytes, got {type(hashes).__name__}"
        )
    return hashes


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
        check_id_array(blocks)
        return tuple(blocks.tolist())
    return tuple(as_block_id(b) for b in blocks)


def check_id_array(blocks: np.ndarray) -> None:
    """Raise :class:`InvalidBlockId` unless ``blocks`` is a 1-D integer array."""
    if blocks.ndim != 1 or blocks.dtype.kind not in "iu":
        raise InvalidBlockId(
            f"block id array must be 1-D integer, got {blocks.dtype} {blocks.shape}"
        )


def candidate_table(to_ids: Callable[[Any], tuple[int, ...]], blocks: Iterable[object],
                    num_cached: object, num_full: object) -> tuple[int, ...]:
    """A block table as ``cache_full_blocks`` reads it: its length and its candidates.

    Only the candidates ``blocks[num_cached:num_full]`` are read (BEHAVIOUR.md §6.6 step 2,
    as in vLLM), so only they are converted, by ``to_ids``; every other position holds the
    null id, which no check and no write reads. Converting the whole table instead made a
    decode step's one-block cache write O(table length). Counts that are not a valid
    non-empty range convert nothing: the spec's count checks raise, or the call is a no-op.
    """
    if isinstance(blocks, np.ndarray):
        check_id_array(blocks)
        table: Any = blocks
    else:
        table = blocks if type(blocks) is list or type(blocks) is tuple else tuple(blocks)
    n = len(table)
    if not (pre.is_count(num_cached) and pre.is_count(num_full) and num_cached < num_full):
        return (NULL_BLOCK_ID,) * n
    lo, hi = min(num_cached, n), min(num_full, n)
    return (NULL_BLOCK_ID,) * lo + to_ids(table[lo:hi]) + (NULL_BLOCK_ID,) * (n - hi)


def as_group_id(value: object) -> Any:
    """A numpy integer group id as a Python int; anything else is left for validation (so
    the result is typed ``Any``: an ``int`` once the call's checks have passed)."""
    if isinstance(value, np.integer):
        return int(value)
    return value


def as_group_ids(values: Iterable[object]) -> tuple[Any, ...]:
    """A lookup's group ids as a tuple (numpy integers as Python ints; each id is validated
    where it is read). ``None``, a single int, a string or anything else that is not a
    collection of ids raises :class:`InvalidArgument`."""
    if type(values) is tuple or type(values) is list:
        groups: tuple[Any, ...] = tuple(values)
        for g in groups:
            if type(g) is not int:  # numpy ints to convert (or bad ids, checked later)
                return tuple(as_group_id(g) for g in groups)
        return groups  # the common case: a few plain ints (~60 ns, no generator)
    if isinstance(values, (str, bytes, bytearray)) or not isinstance(values, Iterable):
        raise InvalidArgument(
            f"kv_cache_group_ids must be a sequence of group ids, got {values!r}"
        )
    return tuple(as_group_id(g) for g in values)


def as_mask(mask: Sequence[object] | None) -> tuple[bool, ...] | None:
    """A block mask as a tuple of bools: entries are bools (numpy's too) or the ints 0/1;
    a 1-D array of them works. Anything else raises :class:`InvalidArgument` (a truthy
    string or a row of a 2-D array is not a yes/no)."""
    if mask is None:
        return None
    if isinstance(mask, np.ndarray):
        if mask.ndim != 1 or mask.dtype.kind not in "biu":
            raise InvalidArgument(
                f"block_mask must be a 1-D bool array, got {mask.dtype} {mask.shape}"
            )
        mask = mask.tolist()
    elif isinstance(mask, (str, bytes)) or not isinstance(mask, Iterable):
        raise InvalidArgument(f"block_mask must be a sequence of bools, got {mask!r}")
    out: tuple[Any, ...] = tuple(mask)
    if set(map(type, out)) <= {bool}:
        return out
    for i, m in enumerate(out):
        if not (isinstance(m, (bool, np.bool_)) or (
            isinstance(m, (numbers.Integral, np.integer)) and m in (0, 1)
        )):
            raise InvalidArgument(f"block_mask[{i}] is {m!r}, not a bool")
    return tuple(bool(m) for m in out)


class PoolShell:
    """The public block-pool API over a backend core (see module docstring).

    Methods mirror vLLM's ``BlockPool`` with block ids instead of block objects.
    """

    backend_name = "abstract"
    bytes_per_block: ClassVar[int] = 0
    """Memory one block costs to build and run this backend (an estimate, checked before
    building: :func:`kvpool.memory.check_pool_fits`)."""
    _delivering = False  # True while callbacks run: state-changing calls are refused

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
        ids: tuple[Any, ...] = tuple(blocks)
        if all(type(b) is int for b in ids):  # fast path: plain ints need no conversion
            return ids
        return tuple(self._local_id(b) for b in ids)

    # -- callbacks ----------------------------------------------------------------------------

    def _refuse_reentry(self, method: str) -> None:
        """Raise :class:`ReentrantCall` if a callback of this pool is running (see ``OnReuse``)."""
        if self._delivering:
            raise ReentrantCall(
                f"{method} was called from a reuse watcher or metrics collector while the "
                "pool delivers its callbacks; state-changing calls are refused then "
                "(queries are allowed): make the call after the operation returns"
            )

    def _deliver(
        self,
        metrics: Sequence[tuple[str, tuple[object, ...]]],
        fired: Sequence[int],
        result: object = None,
    ) -> None:
        """Run the collector's ``metrics`` calls, then the watchers of ``fired`` blocks.

        Every callback runs, whatever the others do; the first failure is re-raised after
        the last (:class:`MetricsCollectorError` or :class:`WatcherError`) with the
        operation's ``result`` as ``.result``, so nothing (e.g. fresh block ids) is lost.
        The watcher table agrees with the core before any callback runs, and callbacks may
        only query the pool (:class:`ReentrantCall`).
        """
        callbacks = [(int(b), self._callbacks.pop(int(b))) for b in fired]
        first: tuple[type[CallbackError], str, Exception] | None = None
        collector = self.metrics_collector
        self._delivering = True
        try:
            for method, args in metrics:
                try:
                    getattr(collector, method)(*args)
                except Exception as exc:  # noqa: BLE001 - re-raised below, typed
                    if first is None:
                        first = (MetricsCollectorError, f"metrics collector {method}", exc)
            for b, callback in callbacks:
                try:
                    callback(b)
                except Exception as exc:  # noqa: BLE001 - re-raised below, typed
                    if first is None:
                        first = (WatcherError, "a reuse watcher", exc)
        finally:
            self._delivering = False
        if first is not None:
            kind, who, cause = first
            error = kind(f"{who} raised: {cause!r}")
            error.result = result
            raise error from cause

    def _fire_watchers(self, fired: Sequence[int], result: object = None) -> None:
        """Call the watchers of ``fired`` blocks in order (see :meth:`_deliver`)."""
        self._deliver((), fired, result)

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

    def _cache_write_ratio(self, hashes: Sequence[object], table_len: int, num_cached: object,
                           num_full: object, block_size: object, group_id: object,
                           mask: tuple[bool, ...] | None) -> int | None:
        """Hash blocks per block of a cache write whose own arguments pass and that writes
        something; ``None`` otherwise (then the core raises, or there is nothing to check)."""
        from kvpool.batch.checks import cache_arguments_rejection

        if cache_arguments_rejection(
            self.enable_caching, self.hash_block_size, len(hashes), table_len, num_cached,
            num_full, block_size, group_id, mask,
        ) is not None or num_cached >= num_full:  # type: ignore[operator]
            return None
        return block_size // self.hash_block_size  # type: ignore[operator]

    def check_hashes(
        self,
        hashes: Sequence[object],
        table_len: int,
        num_cached: object,
        num_full: object,
        block_size: object,
        group_id: object,
        mask: tuple[bool, ...] | None,
    ) -> None:
        """Raise if a hash a cache write reads is not ``bytes``
        (:func:`kvpool.spec.preconditions.bad_block_hashes`), once the call's own arguments
        pass — the spec's order: argument checks, hash types, then the blocks' state."""
        ratio = self._cache_write_ratio(hashes, table_len, num_cached, num_full, block_size,
                                        group_id, mask)
        if ratio is None:
            return
        error = pre.bad_block_hashes(hashes, num_cached, num_full, ratio)  # type: ignore[arg-type]
        if error is not None:
            raise error

    def check_reportable(
        self,
        request: Any,
        hashes: Sequence[object],
        table_len: int,
        num_cached: object,
        num_full: object,
        block_size: object,
        group_id: object,
        mask: tuple[bool, ...] | None,
    ) -> None:
        """With events on: raise the error building this cache call's ``BlockStored`` would
        hit (a request without token ids, a LoRA without a name, ...), before the pool moves.

        Only once the call's own arguments pass (their errors are the core's to raise, in
        the spec's order), so this adds errors and never reorders them.
        """
        ratio = self._cache_write_ratio(hashes, table_len, num_cached, num_full, block_size,
                                        group_id, mask)
        if ratio is None:
            return
        if pre.bad_block_hashes(hashes, num_cached, num_full, ratio) is not None:  # type: ignore[arg-type]
            return
        error = stored_rejection(request, self._events.ctx, hashes, num_cached, num_full,  # type: ignore[arg-type]
                                 block_size, group_id)  # type: ignore[arg-type]
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
        view = _hbs_view(self.hash_block_size, self.num_gpu_blocks)
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
                                             group_id)
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
                _hbs_view(self.hash_block_size), hashes, num_cached_blocks, block_size, group_id
            )
            if error is None and num_cached_blocks:
                ratio = block_size // self.hash_block_size
                error = pre.bad_block_hashes(hashes, 0, num_cached_blocks, ratio) or (
                    stored_rejection(request, self._events.ctx, hashes, 0, num_cached_blocks,
                                     block_size, group_id)
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

    def watched_blocks(self) -> tuple[int, ...]:
        """Blocks with a pending reuse watcher, in watcher-table order."""
        return tuple(self._callbacks)


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

    def queue_front(self, n: int) -> list[int]:
        return list(self.state.free_queue[:n])


@dataclass(frozen=True)
class _HbsView:
    """What the state-free checks read of a pool: its ``hash_block_size``."""

    hash_block_size: int
    num_blocks: int = 0


def _hbs_view(hash_block_size: int, num_blocks: int = 0) -> PoolView:
    """An :class:`_HbsView` where a spec check's signature asks for a whole ``PoolView``:
    the state-free checks it is passed to (``bad_block_size``,
    ``emit_cached_block_events_rejection``) read ``hash_block_size`` only."""
    return cast(PoolView, _HbsView(hash_block_size, num_blocks))


@dataclass(frozen=True)
class PoolAbstract:
    """The canonical observable value of a pool: its core state and its pending events."""

    state: PoolState
    pending_events: tuple[KVCacheEvent, ...]
