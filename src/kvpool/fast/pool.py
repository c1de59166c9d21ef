"""``FastBlockPool``: the Numba array backend behind the shared public pool API.

Contract: observably identical to :class:`kvpool.spec.pool.SpecPool` — results, error types
and messages (checked in the order of :mod:`kvpool.spec.preconditions`), queue order, events
and their sequence numbers, watcher order — only faster. The class converts arguments to
arrays, runs :class:`~kvpool.fast.state.FastState` operations and turns codes into typed
errors and event records into :mod:`kvpool.spec.records`. Bookkeeping lives in the arrays only.

Hot paths skip the generic shell where it costs most (``get_new_blocks``, ``free_blocks``,
``touch``, ``cache_full_blocks``, ``get_num_free_blocks``): plain int lists and numpy int
arrays go straight to a kernel; a metrics collector, a reuse watcher, a :class:`BlockRef` or
any unusual argument falls back to the generic path, so behaviour never depends on the path.
Beyond the protocol:

* :meth:`FastBlockPool.get_new_blocks_array` — the ids as a fresh int64 array (pass it back to
  ``free_blocks``/``touch``: no Python list on either side);
* the batch verbs of :mod:`kvpool.batch` (``find_longest_cache_hit``, ``admit``, ``step``,
  ``cache_full_blocks_batch``, ``free_tables``, ``allocate_and_cache``), one kernel call each
  (:mod:`kvpool.fast.verbs`), and ``observe()`` for their generic checks;
* :meth:`FastBlockPool.check_invariants`, :meth:`FastBlockPool.memory_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpool import batch
from kvpool.errors import (
    CachingDisabled,
    DoubleFree,
    HashStateError,
    InvalidArgument,
    InvalidBlockId,
    KvPoolError,
    NoFreeBlocks,
    NullBlockMisuse,
)
from kvpool.fast import kernels as k
from kvpool.fast.convert import hash_buffer, uniform_lens
from kvpool.fast.state import FastState
from kvpool.fast.verbs import FastBatchVerbs
from kvpool.hash_list import LIST_TYPES as _HASH_LISTS
from kvpool.hash_list import BlockHashList
from kvpool.keys import MAX_GROUP_ID, pack_key
from kvpool.shell import PoolConfig, PoolShell
from kvpool.spec import preconditions as pre
from kvpool.spec.records import (
    ClearedRecord,
    EventRecord,
    PartialStoredRecord,
    RemovedRecord,
    StoredRecord,
)
from kvpool.spec.state import NULL_BLOCK_ID, PoolState

_INT_ONLY = {int}
_BYTES_ONLY = {bytes}
_LIST_OR_TUPLE = (list, tuple)
_INT64 = np.dtype(np.int64)


@dataclass(frozen=True)
class _Dims:
    """The two numbers the spec's argument checks read from a state."""

    num_blocks: int
    hash_block_size: int


class FastBlockPool(FastBatchVerbs, PoolShell):
    """The fast backend (see module docstring). ``jit=False`` runs the same kernels as plain
    Python (slow; for tests and debugging)."""

    backend_name = "fast"
    # 44 bytes of block arrays, plus about 164 for a fully cached pool's key rows (kernels.py)
    bytes_per_block = 208

    def __init__(self, num_gpu_blocks: int, *args: Any, jit: bool = True, _guard: int = 0,
                 _initial_rows: int = 64, **kwargs: Any) -> None:
        # _guard and _initial_rows are testing aids (see FastState).
        self._jit = bool(jit)
        self._guard = _guard
        self._initial_rows = _initial_rows
        super().__init__(num_gpu_blocks, *args, **kwargs)

    def _core_init(self, config: PoolConfig) -> None:
        self._st = st = FastState(
            config.num_gpu_blocks,
            enable_caching=config.enable_caching,
            enable_events=config.enable_kv_cache_events,
            jit=self._jit,
            guard=self._guard,
            initial_rows=self._initial_rows,
        )
        self._dims = _Dims(config.num_gpu_blocks, config.hash_block_size)
        self._out = st.out
        self._meta = st.meta
        self._free_ids = st.free
        self._cand1 = np.zeros(1, np.int64)
        self._lookup_scratch: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    _ONE_OP_VERBS = ("_pop", "_free_one", "_touch_one", "_lookup_one")
    """The state's one-op verbs, kept here on first use (FastState.ONE_OP_VERBS)."""

    def __getattr__(self, name: str) -> Any:
        # Only for attributes not set yet: a one-op verb, bound on first use.
        if name in FastBlockPool._ONE_OP_VERBS and "_st" in self.__dict__:
            verb = getattr(self._st, name[1:])
            setattr(self, name, verb)
            return verb
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        # The one-op verbs are bound to the state's jitclass, and the free verb to its
        # kernels: a copy (deep or pickled) takes them from its own rebuilt state.
        state = self.__dict__.copy()
        for name in (*self._ONE_OP_VERBS, "_free_ids"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._free_ids = self._st.free

    # -- argument conversion ------------------------------------------------------------------

    def _fast_ids(self, blocks: object) -> np.ndarray | None:
        """``blocks`` as an int64 id array, or ``None`` when the generic shell must convert."""
        if type(blocks) is np.ndarray:
            if blocks.ndim != 1 or blocks.dtype.kind not in "iu":
                return None  # the shell raises its InvalidBlockId
            return np.ascontiguousarray(blocks, dtype=np.int64)
        if type(blocks) is list or type(blocks) is tuple:
            if not blocks:
                return self._st.no_ids
            # Exactly ints: bools, floats, numpy scalars and BlockRefs take the shell's path.
            if set(map(type, blocks)) != _INT_ONLY:
                return None
            try:
                return np.fromiter(blocks, np.int64, len(blocks))
            except OverflowError:
                return None
        return None

    def _ids(self, values: tuple[int, ...]) -> np.ndarray:
        """Shell-converted ids (Python ints) as an array; ints beyond int64 are out of range."""
        try:
            return np.array(values, dtype=np.int64).reshape(-1)
        except OverflowError:
            raise self._first_bad_id(values) from None

    def _first_bad_id(self, values: Sequence[int]) -> InvalidBlockId:
        """The error for the first value outside ``[0, N)`` (some value did not fit int64)."""
        return self._bad_id(next(v for v in values if not 0 <= v < self.num_gpu_blocks))

    def _bad_id(self, b: object) -> InvalidBlockId:
        return InvalidBlockId(f"block id {b} is out of range [0, {self.num_gpu_blocks})")

    def _id_error(self, code: int, source: Any, ids: np.ndarray) -> KvPoolError:
        """The typed error for a refused id batch (``source``: the caller's values); a code
        it does not expect raises :meth:`_internal`'s error instead."""
        i = self._st.err_index()
        b = int(source[i])
        if code == k.ERR_BLOCK_ID:
            return self._bad_id(b)
        if code == k.ERR_NULL_BLOCK:
            return NullBlockMisuse("unpin_blocks got the null block (id 0)")
        if code == k.ERR_REF_OVERFLOW:
            error = pre.over_reference(self._core_state(), tuple(int(x) for x in ids))
            if error is None:
                raise self._internal(code)
            return error
        if code == k.ERR_DOUBLE_FREE:
            count = int(np.count_nonzero(ids == b))
            return DoubleFree(
                f"block {b} is released {count} time(s) but has ref_cnt {self._st.ref_cnt(b)}"
            )
        raise self._internal(code)

    @staticmethod
    def _internal(code: int) -> RuntimeError:
        # Not a KvPoolError on purpose: a code the shell does not expect is a kvpool bug.
        return RuntimeError(f"fast pool kernel refused with unexpected code {code}")

    def _record_evictions(self) -> None:
        """Queue the events of an allocation: its evictions' removals, in order (the
        allocation records nothing else). With materialize's builder they are read by one
        kernel (integer hashes) or, for a burst, from the key rows in bulk (bytes)."""
        events = self._events
        if events.builds_removals_in_bulk:
            if events.ctx.use_int_block_hashes:
                rows = self._st.report_removals()
                if rows is not None:
                    events.record_removal_rows(rows)
                    return
            elif self._meta.item(k.M_EV_LEN) > 8:
                burst = self._st.drain_removals()
                if burst is not None:
                    events.record_removals(*burst)
                    return
        removed: list[tuple[int, bytes]] = []
        for kind, _, seq, key in self._st.drain_events():
            if key is None:  # only removals carry a key
                raise RuntimeError(f"fast pool: an allocation recorded a record of kind "
                                   f"{kind} beside its removals (a kvpool bug)")
            removed.append((seq, key))
        self._events.record_removed(removed)

    def _records(self, stored: Any = None, partial: Any = None) -> tuple[EventRecord, ...]:
        out: list[EventRecord] = []
        for kind, _payload, seq, key in self._st.drain_events():
            if kind == k.EV_REMOVED:
                assert key is not None  # drain_events reads the key of every removal
                out.append(RemovedRecord(seq, key))
            elif kind == k.EV_STORED:
                out.append(stored(seq))
            elif kind == k.EV_PARTIAL:
                out.append(partial(seq))
            else:
                out.append(ClearedRecord(seq))
        return tuple(out)

    # -- lean public paths ----------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` free blocks (front first), evicting their old keys. O(n)."""
        if self._delivering:
            self._refuse_reentry("get_new_blocks")
        if type(num_blocks) is int and self.metrics_collector is None:
            try:
                # Unkeyed blocks, or evictions on a pool without events or watchers.
                first = self._pop(num_blocks)
            except OverflowError:  # beyond int64: the generic path reports it
                return super().get_new_blocks(num_blocks)
            if first > 0 and num_blocks == 1:
                return [first]
            if first >= 0:
                return self._out[:num_blocks].tolist()
            if first == -k.ERR_NO_FREE:
                raise NoFreeBlocks(f"Cannot get {num_blocks} free blocks from the pool")
            if first == -k.NEED_FULL and not self._st.num_watchers():
                # Evictions but no watcher: no callbacks to run. Reported by the pop itself
                # when materialize's builder takes integer hashes, else the full kernel.
                events = self._events
                if events.ctx.use_int_block_hashes and events.builds_removals_in_bulk:
                    count = self._st.pop_reported(num_blocks)
                    if count >= 0:
                        if count:
                            rows = self._st.removal_rows[:count].tolist()
                            events.record_removal_rows(rows)
                        if num_blocks == 1:  # a decode step's block
                            return [self._out.item(0)]
                        return self._out[:num_blocks].tolist()
                code, _ = self._st.get_new_blocks(num_blocks)
                if code:
                    raise self._internal(code)
                if self.enable_kv_cache_events:
                    self._record_evictions()
                return self._out[:num_blocks].tolist()
        return super().get_new_blocks(num_blocks)

    def get_new_blocks_array(self, num_blocks: int) -> np.ndarray:
        """:meth:`get_new_blocks` returning a fresh int64 array (pass it to ``free_blocks``)."""
        if self._delivering:
            self._refuse_reentry("get_new_blocks_array")
        if (type(num_blocks) is int and 0 <= num_blocks <= self.num_gpu_blocks
                and self.metrics_collector is None):
            ids = np.empty(num_blocks, np.int64)  # the kernel writes the result in place
            first = self._st.pop_unkeyed_into(ids, num_blocks)
            if first >= 0:
                return ids
            if first == -k.ERR_NO_FREE:
                raise NoFreeBlocks(f"Cannot get {num_blocks} free blocks from the pool")
        return np.array(self.get_new_blocks(num_blocks), dtype=np.int64)

    def free_blocks(self, ordered_blocks: Iterable[object]) -> None:
        """Release one reference per block, first = evict first; see the spec. O(len)."""
        if self._delivering:
            self._refuse_reentry("free_blocks")
        if type(ordered_blocks) is np.ndarray and ordered_blocks.dtype is _INT64:
            if ordered_blocks.ndim == 1:  # int64, any layout: the kernel reads it contiguous
                arr = np.ascontiguousarray(ordered_blocks)
                code = self._free_ids(arr)
                if code:
                    raise self._id_error(code, arr, arr)
                return None
        if type(ordered_blocks) is list and len(ordered_blocks) == 1:  # type: ignore[arg-type]
            b = ordered_blocks[0]  # type: ignore[index]
            if type(b) is int:
                try:
                    code = self._free_one(b)
                except OverflowError:  # beyond int64
                    code = k.ERR_BLOCK_ID
                if code:
                    raise self._bad_id(b) if code == k.ERR_BLOCK_ID else DoubleFree(
                        f"block {b} is released 1 time(s) but has ref_cnt 0"
                    )
                return None
        ids = self._fast_ids(ordered_blocks)
        if ids is None:
            return super().free_blocks(ordered_blocks)
        code = self._free_ids(ids)
        if code:
            raise self._id_error(code, ordered_blocks, ids)
        return None

    def touch(self, blocks: Iterable[object]) -> None:
        """Take a reference on each block (prefix hit); free ones leave the queue. O(len)."""
        if self._delivering:
            self._refuse_reentry("touch")
        if type(blocks) is list and len(blocks) == 1 and self.metrics_collector is None:
            b = blocks[0]
            if type(b) is int:
                try:
                    code = self._touch_one(b)
                except OverflowError:  # beyond int64
                    code = k.ERR_BLOCK_ID
                if code:
                    if code == k.ERR_BLOCK_ID:
                        raise self._bad_id(b)
                    raise self._id_error(code, blocks, np.array(blocks, np.int64))
                return None
        ids = self._fast_ids(blocks) if self.metrics_collector is None else None
        if ids is None:
            return super().touch(blocks)
        code = self._st.touch(ids)
        if code:
            raise self._id_error(code, blocks, ids)
        return None

    def cache_full_blocks(self, request: Any, blocks: Iterable[object], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: Sequence[object] | None = None) -> None:
        """Key the blocks at positions ``[num_cached_blocks, num_full_blocks)``; see the spec.

        Lean path for the common call (candidates that are plain ints in a list, plain int
        arguments that pass every argument check, ``block_size == hash_block_size``, no
        mask); anything else goes through the shell, whose checks then raise in the spec's
        order. Only the candidates are read (:func:`~kvpool.shell.candidate_table`), so a
        decode step's one-block write is O(1) however long the table, and builds no array
        (:func:`~kvpool.fast.kernels.cache_one`). O(candidates).
        """
        if self._delivering:
            self._refuse_reentry("cache_full_blocks")
        num_cached, num_full = num_cached_blocks, num_full_blocks
        hashes: Any = getattr(request, "block_hashes", None)
        # A decode step fills one block: the plain case in a handful of tests and one kernel
        # call (cache_one checks the id, the group and the block, and refuses, changing
        # nothing, a promotion or a write the index must grow for); a refusal takes the
        # path below, which says why. The event, if any, is built first, as below.
        if (num_cached.__class__ is int and num_full.__class__ is int
                and num_full - num_cached == 1 and block_mask is None
                and blocks.__class__ is list and kv_cache_group_id.__class__ is int
                and block_size == self.hash_block_size and block_size.__class__ is int
                and 0 <= num_cached and num_full <= len(blocks)
                and type(hashes) in _HASH_LISTS and num_full <= len(hashes)
                and self.enable_caching):
            b, h = blocks[num_cached], hashes[num_cached]
            if (b.__class__ is int and h.__class__ is bytes and 0 < b < 2**63
                    and 0 <= kv_cache_group_id <= MAX_GROUP_ID):
                events_on = self.enable_kv_cache_events
                if events_on:
                    seq = self._meta.item(k.M_EVENT_COUNT)
                    event, error = self._events.stored_before(
                        request, hashes, num_cached, num_full, block_size, kv_cache_group_id,
                        seq)
                    if error is not None:
                        raise error
                code = (self._st._cache_one or self._st.cache_one_kernel())(
                    b, h, num_cached, kv_cache_group_id, events_on)
                if code == k.OK:
                    if events_on:  # the write recorded exactly its BlockStored
                        if not self._st.take_stored(seq):
                            raise self._internal(code)
                        self._events.append(event)
                    return None
        if (block_mask is None and type(blocks) is list and type(hashes) in _HASH_LISTS
                and type(num_cached) is int and type(num_full) is int
                and type(kv_cache_group_id) is int and self.enable_caching
                and block_size == self.hash_block_size and type(block_size) is int
                and 0 <= num_cached < num_full <= len(blocks) and num_full <= len(hashes)
                and 0 <= kv_cache_group_id <= MAX_GROUP_ID
                and set(map(type, values := blocks[num_cached:num_full])) == _INT_ONLY):
            selected = hashes[num_cached:num_full]
            if len(values) == 1 and type(selected[0]) is bytes:
                h = selected[0]
                buf, lens, max_len = (np.frombuffer(h, np.uint8), uniform_lens(1, len(h)),
                                      len(h))
            elif type(hashes) is BlockHashList and (view := hashes.packed(num_full)) is not None:
                max_len = hashes.width  # the packed companion: a view, no pass over the hashes
                buf, lens = view[num_cached * max_len :], uniform_lens(len(values), max_len)
            elif set(map(type, selected)) == _BYTES_ONLY:
                buf, lens, max_len = hash_buffer(selected, all_bytes=True)
            else:  # a hash that is not bytes: the shell's checks say which, in spec order
                return super().cache_full_blocks(request, blocks, num_cached_blocks,
                                                 num_full_blocks, block_size, kv_cache_group_id)
            event = None
            if self.enable_kv_cache_events:
                if NULL_BLOCK_ID in values:  # the event skips null blocks: built after
                    self.check_reportable(request, hashes, len(blocks), num_cached, num_full,
                                          block_size, kv_cache_group_id, None)
                else:  # every position is keyed: the event is built once, beforehand
                    seq = self._meta.item(k.M_EVENT_COUNT)
                    event, error = self._events.stored_before(
                        request, hashes, num_cached, num_full, block_size, kv_cache_group_id,
                        seq)
                    if error is not None:
                        raise error
            if len(values) == 1 and -(2**63) <= values[0] < 2**63:
                cand = self._cand1  # one block fills per decode step: skip building an array
                cand[0] = values[0]
            else:
                try:
                    cand = np.array(values, dtype=np.int64)
                except OverflowError:
                    raise self._first_bad_id(values) from None
            # The bound kernel directly: it refuses (ERR_CAPACITY, nothing changed) when an
            # array must grow first, which st.cache_full then does before calling it again.
            st = self._st
            code = (st._cache_full or st.cache_full_kernel())(
                cand, st.no_mask, buf, lens, num_cached, 1, kv_cache_group_id, False,
                self.enable_kv_cache_events)
            if code == k.ERR_CAPACITY:
                code = self._st.cache_full(cand, None, buf, lens, num_cached, 1,
                                           kv_cache_group_id, max_len)
            if code:
                raise self._candidate_error(code, values, num_cached, block_size)
            if self.enable_kv_cache_events:
                if event is not None and self._st.take_stored(seq):
                    self._events.append(event)  # the write recorded just that event
                else:  # built after, or a write that first dropped its block's old key
                    stored = self._stored(selected, values, None, num_cached, num_full,
                                          block_size, kv_cache_group_id)
                    self._events.record(self._records(stored=stored), request)
            return None
        return super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks,
                                         block_size, kv_cache_group_id, block_mask)

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
                         ) -> list[int] | None:
        """One block per group id for ``block_hash`` (in the order given), or ``None``. Pure.

        Lean path for one plain-int group and a ``bytes`` hash: one kernel call reading the
        hash in place; anything else goes through the shell's checks.
        """
        if type(block_hash) is bytes and type(kv_cache_group_ids) in _LIST_OR_TUPLE \
                and len(kv_cache_group_ids) == 1:
            g = kv_cache_group_ids[0]
            if type(g) is int:
                try:  # the kernel checks the group's range (LOOKUP_BAD_GROUP: the shell says)
                    b = self._lookup_one(block_hash, g)
                except OverflowError:  # beyond int64
                    b = k.LOOKUP_BAD_GROUP
                if b >= 0:
                    return [b]
                if b == -1:
                    return None
        return super().get_cached_block(block_hash, kv_cache_group_ids)

    def ref_cnt(self, block_id: int) -> int:
        """One block's ref count (what ``observe().ref_cnts([block_id])[0]`` says, without
        building a list); :class:`InvalidBlockId` outside ``[0, num_gpu_blocks)``. O(1)."""
        if type(block_id) is not int or not 0 <= block_id < self.num_gpu_blocks:
            raise self._bad_id(block_id)
        return self._st.blk.item(block_id, k.REF)  # type: ignore[no-any-return]

    def get_num_free_blocks(self) -> int:
        """Free blocks, cached candidates and unpinned blocks included. O(1)."""
        return self._meta.item(k.M_NUM_FREE)

    # -- core: allocation and release -----------------------------------------------------

    def _core_get_new_blocks(self, n: int):
        if not pre.is_count(n):
            raise InvalidArgument(f"num_blocks must be a non-negative int, got {n!r}")
        if n > self._st.num_free():
            raise NoFreeBlocks(f"Cannot get {n} free blocks from the pool")
        code, fired = self._st.get_new_blocks(n)
        if code:
            raise self._internal(code)
        return self._out[:n].tolist(), self._records(), self._st.fired(fired)

    def _core_touch(self, ids: tuple[int, ...]) -> None:
        arr = self._ids(ids)
        code = self._st.touch(arr)
        if code:
            raise self._id_error(code, ids, arr)

    def _core_check_free(self, ids: tuple[int, ...]) -> KvPoolError | None:
        try:
            arr = self._ids(ids)
        except KvPoolError as error:
            return error
        code = self._st.check_free(arr)
        return self._id_error(code, ids, arr) if code else None

    def _core_free(self, ids: tuple[int, ...]) -> None:
        arr = self._ids(ids)
        code = self._st.free(arr)
        if code:
            raise self._id_error(code, ids, arr)

    def _core_unpin(self, ids: tuple[int, ...]) -> None:
        arr = self._ids(ids)
        code = self._st.unpin(arr)
        if code:
            raise self._id_error(code, ids, arr)

    # -- core: the prefix cache -------------------------------------------------------------

    def _check_lookup_arguments(self, block_hash_ok: bool, what: object,
                                group_ids: Sequence[object]) -> None:
        if not block_hash_ok:
            raise InvalidArgument(f"block_hash must be bytes, got {type(what).__name__}")
        if not group_ids:
            raise InvalidArgument("get_cached_block needs at least one group id")
        for g in group_ids:
            error = pre.bad_group_id(g)
            if error:
                raise error

    def _lookup_arrays(self, group_ids: tuple[int, ...], width: int):
        """``(group ids, output)`` arrays for a lookup of ``width`` hashes; kept per group
        tuple and grown as needed (the output may be wider than asked)."""
        arrays = self._lookup_scratch.get(group_ids)
        if arrays is None or arrays[1].shape[1] < width:
            wide = max(width, 1, 0 if arrays is None else 2 * arrays[1].shape[1])
            arrays = (np.array(group_ids, np.int64), np.empty((len(group_ids), wide), np.int64))
            if len(self._lookup_scratch) < 64:  # bounded: group tuples are few in practice
                self._lookup_scratch[group_ids] = arrays
        return arrays

    def _core_get_cached_block(self, block_hash: bytes, group_ids: tuple[int, ...]):
        self._check_lookup_arguments(isinstance(block_hash, bytes), block_hash, group_ids)
        groups, out = self._lookup_arrays(group_ids, 1)
        lens = uniform_lens(1, len(block_hash))
        code = self._st.lookup(np.frombuffer(block_hash, np.uint8), lens, groups, out)
        if code:
            raise self._internal(code)
        if self._st.result() != 1:
            return None
        return tuple(out[:, 0].tolist())

    def _cache_arguments(self, hashes, table_len, num_cached, num_full, block_size, group_id,
                         mask) -> int:
        """The state-free checks of a cache write; the ratio bs/hbs, or 0 for a no-op."""
        hbs = self.hash_block_size
        if (type(num_cached) is int and type(num_full) is int and type(block_size) is int
                and type(group_id) is int and self.enable_caching
                and 0 <= num_cached < num_full <= table_len and 0 <= group_id <= MAX_GROUP_ID
                and block_size > 0 and block_size % hbs == 0
                and (mask is None or len(mask) == num_full - num_cached)
                and len(hashes) // (block_size // hbs) >= num_full):
            return block_size // hbs  # every check passes: skip building the errors
        error = batch.cache_arguments_rejection(
            self.enable_caching, hbs, len(hashes), table_len, num_cached, num_full, block_size,
            group_id, mask,
        )
        if error:
            raise error
        return block_size // hbs if num_cached < num_full else 0

    def _candidate_error(self, code: int, cand: Sequence[int], num_cached: int,
                         block_size: int) -> KvPoolError:
        i = self._st.err_index()
        b = int(cand[i])
        if code == k.ERR_BLOCK_ID:
            return self._bad_id(b)
        if code == k.ERR_DUPLICATE:
            return InvalidArgument(f"block {b} appears twice among the blocks to cache")
        if code == k.ERR_FREE_BLOCK:
            return HashStateError(f"cannot cache free block {b} (ref_cnt 0)")
        if code == k.ERR_KEYED:
            tokens = self._st.primary_units()[b] * self.hash_block_size
            pos = num_cached + i
            return HashStateError(
                f"block {b} already carries a key covering {tokens} tokens "
                f"(caching it at position {pos} would cover {(pos + 1) * block_size})"
            )
        raise self._internal(code)

    def _stored(self, hashes, cand, mask, num_cached, num_full, block_size, group_id):
        """A factory of the call's ``StoredRecord`` (built only when events are on)."""

        def make(seq: int) -> StoredRecord:
            offsets = [
                i for i, b in enumerate(cand) if b != NULL_BLOCK_ID and (mask is None or mask[i])
            ]
            return StoredRecord(seq, group_id, block_size, num_cached, num_full,
                                tuple(num_cached + i for i in offsets),
                                tuple(hashes[i] for i in offsets))

        return make

    def _core_cache_full_blocks(self, hashes, ids, num_cached, num_full, block_size, group_id,
                                mask):
        if not isinstance(hashes, (list, tuple)):
            hashes = tuple(hashes)
        ratio = self._cache_arguments(hashes, len(ids), num_cached, num_full, block_size,
                                      group_id, mask)
        if not ratio:
            return ()
        cand_values = ids[num_cached:num_full]
        try:
            cand = np.array(cand_values, dtype=np.int64).reshape(-1)
        except OverflowError:
            raise self._first_bad_id(cand_values) from None
        selected = hashes[num_cached * ratio + ratio - 1 : num_full * ratio : ratio]
        buf, lens, max_len = hash_buffer(selected)
        mask_arr = None if mask is None else np.array(mask, dtype=np.uint8).reshape(-1)
        code = self._st.cache_full(cand, mask_arr, buf, lens, num_cached, ratio, group_id,
                                   max_len)
        if code:
            raise self._candidate_error(code, cand_values, num_cached, block_size)
        return self._records(
            stored=self._stored(selected, cand_values, mask, num_cached, num_full, block_size,
                                group_id)
        )

    def _core_cache_partial_block(self, hashes, block_id, num_tokens, group_id, block_size,
                                  replace_existing):
        if not self.enable_caching:
            raise CachingDisabled("cache_partial_block on a pool with caching disabled")
        if not 0 <= block_id < self.num_gpu_blocks:
            raise self._bad_id(block_id)
        if block_id == NULL_BLOCK_ID:
            return None, ()
        error = pre.bad_group_id(group_id) or pre.bad_block_size(self._dims, block_size)  # type: ignore[arg-type]
        if error:
            raise error
        hbs = self.hash_block_size
        if not pre.is_count(num_tokens) or num_tokens % hbs != 0:
            raise InvalidArgument(f"num_tokens {num_tokens!r} is not a multiple of hbs {hbs}")
        if not 0 < num_tokens // hbs <= len(hashes):
            raise InvalidArgument(
                f"num_tokens {num_tokens} needs {num_tokens // hbs} block hashes; "
                f"the request has {len(hashes)}"
            )
        block_hash = hashes[num_tokens // hbs - 1]
        key = pack_key(block_hash, group_id)
        buf = np.frombuffer(key[: len(key) - 4], np.uint8)
        code = self._st.cache_partial(block_id, buf, num_tokens // hbs, group_id,
                                      bool(replace_existing))
        if code == k.ERR_FREE_BLOCK:
            raise HashStateError(f"cannot cache free block {block_id} (ref_cnt 0)")
        if code:
            raise self._internal(code)
        records = self._records(
            partial=lambda seq: PartialStoredRecord(seq, group_id, num_tokens, block_hash)
        )
        return key, records

    def _core_move_block_hashes(self, src: int, dst: int) -> None:
        if not self.enable_caching:
            raise CachingDisabled("move_block_hashes on a pool with caching disabled")
        for b in (src, dst):
            if not 0 <= b < self.num_gpu_blocks:
                raise self._bad_id(b)
        if NULL_BLOCK_ID in (src, dst):
            raise NullBlockMisuse(f"move_block_hashes({src}, {dst}) involves the null block")
        if src == dst:
            raise InvalidArgument(f"move_block_hashes source and destination are both {src}")
        code = self._st.move(src, dst)
        if code == k.ERR_DST_KEYED:
            raise HashStateError(f"destination block {dst} already has a cache key")
        if code == k.ERR_FREE_BLOCK:
            b = (src, dst)[self._st.err_index()]
            raise HashStateError(f"move_block_hashes on free block {b} (ref_cnt 0)")
        if code:
            raise self._internal(code)

    def _core_evict_blocks(self, ids: tuple[int, ...]) -> tuple[EventRecord, ...]:
        arr = self._ids(ids)
        code = self._st.evict(arr)
        if code:
            raise self._id_error(code, ids, arr)
        return self._records()

    def _core_reset_prefix_cache(self):
        code, fired = self._st.reset()
        if code:
            raise self._internal(code)
        if not self._st.result():
            return False, (), ()
        return True, self._records(), self._st.fired(fired)

    def _core_emit_cached_block_events(self, hashes, num_cached, block_size, group_id):
        error = pre.emit_cached_block_events_rejection(
            self._dims, tuple(hashes), num_cached, block_size, group_id  # type: ignore[arg-type]
        )
        if error:
            raise error
        if num_cached == 0 or not self.enable_kv_cache_events:
            return ()
        coarse = pre.hashes_at_block_size(self._dims, tuple(hashes), block_size)  # type: ignore[arg-type]
        record = StoredRecord(self._st.next_event_seq(), group_id, block_size, 0, num_cached,
                              tuple(range(num_cached)), coarse[:num_cached])
        return (record,)

    def _core_is_block_writable(self, block_id: int) -> bool:
        if not 0 <= block_id < self.num_gpu_blocks:
            raise self._bad_id(block_id)
        return self._st.writable(block_id)

    def _core_num_free_blocks(self) -> int:
        return self._st.num_free()

    def _core_state(self) -> PoolState:
        return self._st.to_pool_state(self.hash_block_size)

    # -- introspection ---------------------------------------------------------------------

    def check_invariants(self) -> list[tuple[str, tuple]]:
        """``[(name, witnesses)]`` for every broken claim; ``[]`` when sound. O(N + keys).

        The spec's invariants on the pool's state, then the representation's own claims
        (:mod:`kvpool.fast.integrity`: links mutual, counters equal to recounts, the hash
        table holding exactly the live keys).
        """
        from kvpool.fast.integrity import violations
        from kvpool.spec.invariants import violated_invariants

        return violated_invariants(self._core_state()) + violations(self._st)

    def memory_bytes(self) -> int:
        """Bytes held by the pool's arrays (hash-index arrays grow as keys appear). O(1)."""
        return self._st.nbytes()
