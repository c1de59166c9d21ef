"""``FastCore``: the pool's state in arrays (:class:`~kvpool.fast.state.FastState`) behind
the generic shell's core operations.

Contract: every ``_core_*`` operation of :class:`~kvpool.shell.PoolShell` on the arrays,
observably identical to :class:`kvpool.spec.pool.SpecPool`'s (the shell checks arguments in
the spec's order first); kernel codes become the spec's typed errors, and the kernels' event
records become :mod:`kvpool.spec.records`. :class:`~kvpool.fast.pool.FastBlockPool` adds the
lean public paths and the batch verbs on top; both read the helpers here (id conversion,
error typing, event draining).
"""

from __future__ import annotations

from collections.abc import Sequence
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
from kvpool.fast.readback import pool_state
from kvpool.fast.state import FastState
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


@dataclass(frozen=True)
class _Dims:
    """The two numbers the spec's argument checks read from a state."""

    num_blocks: int
    hash_block_size: int


class FastCore(PoolShell):
    """The generic shell over the fast arrays (see module docstring); ``jit=False`` runs the
    same kernels as plain Python (slow; for tests and debugging)."""

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
        if name in FastCore._ONE_OP_VERBS and "_st" in self.__dict__:
            verb = getattr(self._st, name[1:])
            setattr(self, name, verb)
            return verb
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        # The one-op verbs are bound to the state's PoolArrays, and the free verb to its
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
        error = pre.get_cached_block_rejection(self._dims, block_hash, group_ids)  # type: ignore[arg-type]
        if error:  # the shell checked these; the core refuses them on its own too
            raise error
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
            tokens = self._st.blk64.item(b, k.TOKENS) * self.hash_block_size
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
        return pool_state(self._st, self.hash_block_size)
