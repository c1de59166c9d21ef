"""``FastState``: the one owner of every array of a fast pool (layout: :mod:`.kernels`).

Contract: nothing else writes these arrays. The state allocates them, grows the hash-index
arrays before a call that may need room (kernels refuse rather than overflow), runs the
kernels through its methods and decodes the event records a call produced. It knows nothing
about typed errors or requests: methods return the kernels' codes and raw values.

Memory at construction is ``N·(20 + 16 + 8)`` bytes (``blk``, ``blk64`` and the output
scratch) plus small hash-index arrays that double when they fill up, so a pool that caches
nothing never pays for keys. The block arrays are allocated zeroed and construction writes
five rows of them (the relative encoding in :mod:`.kernels`), so building a pool of any size
costs microseconds; the operating system supplies each page when a block on it is first
used. ``guard`` (tests only) surrounds every array with sentinel rows
so that a kernel writing out of bounds is caught by :meth:`guards_intact`; a tiny
``initial_rows`` (tests) makes the hash table collide and grow often.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from kvpool.errors import InvalidConfig
from kvpool.fast import kernels as k
from kvpool.fast.compiled import kernel_set, pool_arrays_maker, pool_arrays_setter
from kvpool.keys import GROUP_ID_BYTES

MAX_BLOCKS = 2**31 - 3  # ids and the two queue sentinels fit int32
INITIAL_ROWS = 64  # entry and key rows; doubled on demand
INITIAL_STRIDE = 64  # key bytes per row: a SHA-256 digest plus the 4 group bytes, rounded up
LINE = 64  # every array starts on a cache-line boundary (kernels.py: the key storage)
GUARD_BYTE = 0x5A


def key_stride(max_len: int) -> int:
    """Bytes per key row for hashes of up to ``max_len`` bytes: the packed key's length
    rounded up to a power of two (at least 16), so that no row straddles a cache line."""
    stride = 16
    while stride < max_len + 4:
        stride *= 2
    return stride


def _aligned(shape: tuple[int, ...], dtype: Any, fill: int | None) -> np.ndarray:
    """An array starting on a ``LINE``-byte boundary (numpy only promises 16). Zero-filled
    ones keep numpy's calloc: pages are zeroed by the OS when first touched, not here."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = (np.zeros if fill == 0 else np.empty)(nbytes + LINE, np.uint8)
    start = -raw.ctypes.data % LINE
    array = raw[start : start + nbytes].view(dtype).reshape(shape)
    if fill not in (None, 0):
        array.fill(fill)
    return array


class FastState:
    """The arrays of one pool and the kernel calls over them (see module docstring)."""

    def __init__(
        self,
        num_blocks: int,
        *,
        enable_caching: bool,
        enable_events: bool,
        jit: bool = True,
        guard: int = 0,
        initial_rows: int = INITIAL_ROWS,
    ) -> None:
        self.num_blocks = n = int(num_blocks)
        if n > MAX_BLOCKS:
            raise InvalidConfig(f"the fast pool holds at most {MAX_BLOCKS} blocks (int32 ids)")
        self.enable_caching = bool(enable_caching)
        self.enable_events = bool(enable_events)
        self._quiet_first = self.enable_caching and not self.enable_events
        self.kernels = kernel_set(jit)
        self._guard = int(guard)
        self._guarded: list[tuple[np.ndarray, np.ndarray]] = []
        # Zeroed (calloc: zero pages on first touch): a zero row is a fresh block in the
        # kernels' relative encoding, so init_state writes five rows whatever n is.
        self.blk = self._alloc((n + 2, k.BLK_COLS), np.int32, fill=0)
        # Zero-filled by the allocator (calloc: pages are zeroed on first touch, not here).
        self.blk64 = self._alloc((n + 2, k.BLK64_COLS), np.int64, fill=0)
        self.meta = self._alloc((k.META_SIZE,), np.int64)
        self.out = self._alloc((n,), np.int64)  # result scratch: allocated ids, queue order
        rows = max(1, int(initial_rows))
        self.ent = self._alloc((rows, k.ENT_COLS), np.int32)
        self.keys = self._alloc((rows, k.KEY_COLS), np.int64, fill=0)  # K_GEN counts from 0
        self.key_bytes = self._alloc((rows, INITIAL_STRIDE), np.uint8)
        self.table = self._alloc((2 * rows,), np.int64, fill=-1)
        self.events = self._alloc((rows if enable_events else 1, k.EV_COLS), np.int64)
        self._batch: tuple[Any, Any, Any] | None = None  # _batch_kernels(), once bound
        self._cache_full: Callable[..., int] | None = None  # cache_full_kernel(), likewise
        self._cache_one: Callable[..., int] | None = None  # cache_one_kernel(), likewise
        self._take_and_key: Callable[..., int] | None = None  # take_and_key_kernel(), too
        self._group_step: Callable[..., int] | None = None  # group_step_kernel(), too
        self.no_ids = np.empty(0, np.int64)
        # (group, hash bits, seq) per removal reported (report_removals): one per record
        self.removal_rows = np.empty((self.events.shape[0], 3), np.int64)
        self.no_mask = np.empty(0, np.uint8)
        self.kernels.init_state(self.blk, self.meta)
        self.arrays: Any = None  # the kernels' PoolArrays (pool_arrays()), built on first use
        self._bind_verbs()

    def _bind_verbs(self) -> None:
        """The hot verbs, pre-bound to the arrays that never move (blk, meta, out): one
        C-level call from the shell straight into the compiled entry point; then the ones
        bound to the hash index's arrays (:meth:`_bind_index_verbs`)."""
        ks = self.kernels
        self.pop_unkeyed = partial(ks.get_new_blocks_unkeyed, self.blk, self.meta, self.out)
        self.pop_unkeyed_into = partial(ks.get_new_blocks_unkeyed, self.blk, self.meta)
        self.free = partial(ks.free_blocks, self.blk, self.meta, self.enable_caching, False)
        self.check_free = partial(ks.free_blocks, self.blk, self.meta, self.enable_caching, True)
        self.touch = partial(ks.touch, self.blk, self.meta)
        self._bind_index_verbs()

    ONE_OP_VERBS = ("lookup_one", "touch_one", "free_one", "pop")
    """``lookup_one(hash, group)``, ``touch_one(b)``, ``free_one(b)``, ``pop(n)``: the h_*
    kernels over :meth:`pool_arrays`, each bound on its first use (a process that never
    calls one never loads it from the disk cache, nor compiles it on a cold one)."""
    _REBUILT = ("arrays", "_in_arrays", *ONE_OP_VERBS,
                "kernels", "pop_unkeyed", "pop_unkeyed_into", "free", "check_free", "touch",
                "pop_quiet", "pop_reported", "_cache_full", "_cache_one", "_take_and_key",
                "_group_step", "_batch")
    """Attributes a copy rebuilds instead of copying: the PoolArrays, the kernel set and every
    verb bound to compiled entry points (none of them can be pickled)."""

    def __getattr__(self, name: str) -> Any:
        # Only for attributes not set yet: the one-op verbs, bound here on first use.
        if name in FastState.ONE_OP_VERBS and "blk" in self.__dict__:
            self._bind_one_op(name)
            return self.__dict__[name]
        raise AttributeError(name)

    def _bind_one_op(self, name: str) -> None:
        """Bind the one-op verb ``name`` alone, loading only its kernel: the h_* kernel over
        :meth:`pool_arrays` (one argument to convert: kernels.PoolArrays says why)."""
        setattr(self, name, partial(getattr(self.kernels, "h_" + name), self.pool_arrays()))

    def __getstate__(self) -> dict[str, Any]:
        # copy.deepcopy (the exhaustive checker copies pools) and pickle: the arrays and
        # settings; the kernels and what is bound to them are rebuilt by __setstate__.
        state = self.__dict__.copy()
        for name in self._REBUILT:
            state.pop(name, None)
        state["_jit"] = self.kernels.jit
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.kernels = kernel_set(state.pop("_jit"))
        self.__dict__.update(state)
        self.arrays = None  # rebuilt over the copied arrays on first use
        self._unbind_index()
        self._bind_verbs()

    def _bind_index_verbs(self) -> None:
        """Point :attr:`arrays` at the hash index's current arrays (again after any of them
        grows) and bind ``pop_quiet(n)`` (:func:`~kvpool.fast.kernels.get_new_blocks_quiet`)."""
        self._repoint_arrays()
        # Bound on their first call (a pool that never evicts never compiles them).
        self.pop_quiet = self._bind_pop_quiet
        self.pop_reported = self._bind_pop_reported

    def pool_arrays(self) -> Any:
        """The :class:`~kvpool.fast.kernels.PoolArrays` the index kernels and the one-op
        kernels take first: one object for the life of this state (an array that grows is
        repointed in it, :meth:`_repoint_arrays`), so a kernel call bound to it stays valid."""
        arrays = self.arrays
        if arrays is None:
            arrays = self.arrays = pool_arrays_maker(self.kernels.jit)(
                self.blk, self.blk64, self.ent, self.keys, self.key_bytes, self.table,
                self.meta, self.events, self.out, self.enable_caching, self.enable_events)
            self._in_arrays = self._growing_arrays()
        return arrays

    def _growing_arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays :meth:`reserve` and :meth:`reserve_events` may replace."""
        return (self.ent, self.keys, self.key_bytes, self.table, self.events)

    def _repoint_arrays(self) -> None:
        """Store the arrays that were replaced (grown) into :attr:`arrays`, if built."""
        if self.arrays is not None:
            current = self._growing_arrays()
            if any(a is not b for a, b in zip(current, self._in_arrays, strict=True)):
                pool_arrays_setter(self.kernels.jit)(self.arrays, *current)
                self._in_arrays = current

    def _unbind_index(self) -> None:
        """Forget every kernel call bound over :attr:`arrays` (this is a copy, whose arrays
        are new): each is bound again on its next use."""
        self._batch = self._cache_full = self._cache_one = None
        self._take_and_key = self._group_step = None

    def _bind_pop_quiet(self, n: int) -> int:
        ks = self.kernels
        self.pop_quiet = partial(ks.get_new_blocks_quiet, self.blk, self.blk64, self.ent,
                                 self.keys, self.table, self.meta, self.out,
                                 self.enable_caching)
        return int(self.pop_quiet(n))

    def _bind_pop_reported(self, n: int) -> int:
        ks = self.kernels
        self.pop_reported = partial(ks.get_new_blocks_reported, self.blk, self.blk64, self.ent,
                                    self.keys, self.key_bytes, self.table, self.meta,
                                    self.events, self.out, self.removal_rows,
                                    self.enable_caching)
        return int(self.pop_reported(n))

    # -- allocation ---------------------------------------------------------------------------

    def _alloc(self, shape: tuple[int, ...], dtype: Any, fill: int | None = None) -> np.ndarray:
        """An array; with ``guard`` rows of sentinel bytes on both sides (a C-contiguous view)."""
        g = self._guard
        if not g:
            return _aligned(shape, dtype, fill)
        outer = np.empty((shape[0] + 2 * g, *shape[1:]), dtype)
        outer.view(np.uint8)[...] = GUARD_BYTE
        inner = outer[g : g + shape[0]]
        if fill is not None:
            inner[...] = fill
        self._guarded.append((outer, inner))
        return inner

    def guards_intact(self) -> bool:
        """Whether every sentinel row of every array ever allocated is unchanged."""
        g = self._guard
        for outer, _ in self._guarded:
            raw = outer.reshape(outer.shape[0], -1).view(np.uint8)
            if (raw[:g] != GUARD_BYTE).any() or (raw[-g:] != GUARD_BYTE).any():
                return False
        return True

    def nbytes(self) -> int:
        """Bytes held by the arrays (views of guarded buffers count their visible part)."""
        arrays = (self.blk, self.blk64, self.meta, self.out, self.ent, self.keys,
                  self.key_bytes, self.table, self.events)
        return sum(a.nbytes for a in arrays)

    def _grow(self, old: np.ndarray, rows: int, cols: int | None = None) -> np.ndarray:
        shape = (rows, *(old.shape[1:] if cols is None else (cols,)))
        new = self._alloc(shape, old.dtype, fill=0)
        if old.ndim == 1:
            new[: old.shape[0]] = old
        else:
            new[: old.shape[0], : old.shape[1]] = old
        return new

    def reserve(self, pairs: int, max_len: int) -> None:
        """Room for ``pairs`` new (key, block) pairs with hashes of up to ``max_len`` bytes,
        plus every event record the next call can produce. Amortised O(1)."""
        meta = self.meta
        ent_used, key_used = meta.item(k.M_ENT_USED), meta.item(k.M_KEY_USED)
        if (self.ent.shape[0] - ent_used >= pairs and self.keys.shape[0] - key_used >= pairs
                and max_len + 4 <= self.key_bytes.shape[1]
                and 2 * (key_used + pairs) <= self.table.shape[0] and not self.enable_events):
            return  # the common case: room everywhere
        if self.ent.shape[0] - ent_used < pairs:
            self.ent = self._grow(self.ent, max(2 * self.ent.shape[0], ent_used + pairs))
        if self.keys.shape[0] - key_used < pairs:
            rows = max(2 * self.keys.shape[0], key_used + pairs)
            self.keys = self._grow(self.keys, rows)
            self.key_bytes = self._grow(self.key_bytes, rows)
        if max_len + 4 > self.key_bytes.shape[1]:
            self.key_bytes = self._grow(self.key_bytes, self.key_bytes.shape[0],
                                        key_stride(max_len))
        if 2 * (key_used + pairs) > self.table.shape[0]:
            size = self.table.shape[0]
            while 2 * (key_used + pairs) > size:
                size *= 2
            table = self._alloc((size,), np.int64, fill=-1)
            code = self.kernels.rehash(self.keys, table, meta)
            assert code == k.OK, "rehash into a table that is too small"
            self.table = table
        self._bind_index_verbs()
        self.reserve_events()

    def reserve_events(self, extra: int = 0) -> None:
        """Room for the records of one call: one per live entry, plus one (plus ``extra``)."""
        if self.enable_events:
            need = self.meta.item(k.M_ENT_USED) + 2 + extra
            if self.events.shape[0] < need:
                self.events = self._grow(self.events, max(2 * self.events.shape[0], need))
                self.removal_rows = np.empty((self.events.shape[0], 3), np.int64)
                self._repoint_arrays()
                self.pop_reported = self._bind_pop_reported

    # -- operations (codes as the kernels return them) ---------------------------------------

    def get_new_blocks(self, n: int) -> tuple[int, np.ndarray]:
        """The full allocation (eviction, watchers); ``(code, fired buffer)``."""
        self.reserve_events()
        watchers = self.meta.item(k.M_NUM_WATCHERS)
        fired = np.empty(min(n, watchers), np.int64) if watchers and n > 0 else self.no_ids
        code = self.kernels.get_new_blocks(
            self.blk, self.blk64, self.ent, self.keys, self.table, self.meta, self.events,
            self.out, fired, n, self.enable_caching, self.enable_events,
        )
        return code, fired

    def unpin(self, ids: np.ndarray) -> int:
        return self.kernels.unpin_blocks(self.blk, self.blk64, self.meta, ids)

    def lookup(self, buf: np.ndarray, lens: np.ndarray, groups: np.ndarray,
               out: np.ndarray) -> int:
        return self.kernels.lookup_blocks(
            self.ent, self.keys, self.key_bytes, self.table, self.meta, buf, lens, groups, out
        )

    def lookup_each(self, buf: np.ndarray, lens: np.ndarray, groups: np.ndarray,
                    out: np.ndarray) -> int:
        return self.kernels.lookup_each(
            self.keys, self.key_bytes, self.table, self.meta, buf, lens, groups, out
        )

    def lookup_run_from_end(self, buf: np.ndarray, lens: np.ndarray, groups: np.ndarray,
                            out: np.ndarray, run_length: int, end_every: int,
                            end_shift: int) -> int:
        return self.kernels.lookup_run_from_end(
            self.keys, self.key_bytes, self.table, self.meta, buf, lens, groups, out,
            run_length, end_every, end_shift
        )

    def cache_full(self, cand: np.ndarray, mask: np.ndarray | None, buf: np.ndarray,
                   lens: np.ndarray, num_cached: int, ratio: int, group: int,
                   max_len: int) -> int:
        """``max_len``: the longest hash in ``lens`` (the caller knows it cheaply)."""
        self.reserve(cand.shape[0], max_len)
        return self.kernels.cache_full_blocks(
            self.pool_arrays(), cand, self.no_mask if mask is None else mask, buf, lens,
            num_cached, ratio, group, mask is not None, self.enable_events,
        )

    def allocate_and_cache(self, n: int, cand: np.ndarray, num_old: int, first_new: int,
                           mask: np.ndarray | None, buf: np.ndarray, lens: np.ndarray,
                           max_len: int, num_cached: int, ratio: int, group: int,
                           dry_run: bool) -> int:
        self.reserve(cand.shape[0], max_len)
        return self.kernels.allocate_and_cache(
            self.pool_arrays(), cand, num_old, first_new,
            self.no_mask if mask is None else mask, buf, lens, n, num_cached, ratio, group,
            mask is not None, self.enable_events, dry_run,
        )

    def cache_full_kernel(self) -> Callable[..., int]:
        """``cache_full_blocks`` with :meth:`pool_arrays` bound, bound on its own: a run that
        only caches full blocks (``kvpool simulate``) never compiles the fused
        ``admit_request`` / ``run_step`` (~5 s on a cold disk cache)."""
        fn = self._cache_full
        if fn is None:
            fn = self._cache_full = partial(self.kernels.cache_full_blocks, self.pool_arrays())
        return fn

    def cache_one_kernel(self) -> Callable[..., int]:
        """``cache_one(b, hash, position, group, events_on)`` with :meth:`pool_arrays`
        bound: a decode step's one-block write. It refuses
        (``ERR_CAPACITY``, nothing changed) when the index must grow first."""
        fn = self._cache_one
        if fn is None:
            fn = self._cache_one = partial(self.kernels.cache_one, self.pool_arrays())
        return fn

    def take_and_key_kernel(self) -> Callable[..., int]:
        """``take_and_key(n, b, hash, position, group)`` with :meth:`pool_arrays` bound
        (the ids land in ``out``): a step that takes blocks and keys the one it
        filled, on a quiet pool. It refuses (nothing changed) where the two verbs must run."""
        fn = self._take_and_key
        if fn is None:
            fn = self._take_and_key = partial(self.kernels.take_and_key, self.pool_arrays())
        return fn

    def group_step_kernel(self) -> Callable[..., int]:
        """``group_step(plan, buf, n, reserve)`` with :meth:`pool_arrays` and the caching
        flag bound (the new ids land in ``out``): a hybrid model's running step
        on a quiet pool. It refuses (nothing changed) where the verbs must run."""
        fn = self._group_step
        if fn is None:
            fn = self._group_step = partial(self.kernels.group_step, self.pool_arrays(),
                                            self.enable_caching)
        return fn

    def _batch_kernels(self) -> tuple[Any, Any, Any]:
        """``admit_request``, ``run_step`` and ``cache_full_blocks`` with
        :meth:`pool_arrays` bound: one C-level call per verb."""
        bound = self._batch
        if bound is None:
            arrays, ks = self.pool_arrays(), self.kernels
            bound = self._batch = (partial(ks.admit_request, arrays),
                                   partial(ks.run_step, arrays),
                                   self.cache_full_kernel())
        return bound

    def admit(self, memo: np.ndarray, known: int, buf: np.ndarray, lens: np.ndarray,
              max_len: int, max_hit: int, num_blocks: int, num_full: int, reserve: int,
              ratio: int, group: int) -> int:
        """``kernels.admit_request`` (the table lands in ``out``; M_RESULT = hits, or the
        positions of ``memo`` still valid after a refusal).

        The arrays are grown only when the kernel finds no room: it refuses before it
        changes anything, so the call is simply repeated after growing.
        """
        args = (memo, buf, lens, max_hit, num_blocks, num_full, reserve, ratio, group, known,
                self.enable_caching, self.enable_events)
        code = self._batch_kernels()[0](*args)
        if code == k.ERR_CAPACITY:
            self.reserve(max(0, num_full), max_len)
            code = self._batch_kernels()[0](*args)
        return code

    def step(self, plan: np.ndarray, freed: np.ndarray, buf: np.ndarray, lens: np.ndarray,
             max_len: int, ratio: int, group: int) -> int:
        """``kernels.run_step`` over a plan (its layout: the kernel's docstring); grows the
        arrays and repeats the call when the kernel finds no room, as :meth:`admit`."""
        args = (plan, freed, buf, lens, ratio, group, self.enable_caching, self.enable_events)
        code = self._batch_kernels()[1](*args)
        if code == k.ERR_CAPACITY:
            pairs = lens.shape[0]
            self.reserve(pairs, max_len)
            self.reserve_events(pairs + int(plan[0]))  # promotions remove entries it adds
            code = self._batch_kernels()[1](*args)
        return code

    def cache_partial(self, b: int, buf: np.ndarray, units: int, group: int,
                      replace: bool) -> int:
        self.reserve(1, buf.shape[0])
        return self.kernels.cache_partial_block(
            self.pool_arrays(), b, buf, units, group, replace, self.enable_events
        )

    def move(self, src: int, dst: int) -> int:
        return self.kernels.move_block_hashes(
            self.blk, self.blk64, self.ent, self.keys, self.meta, src, dst
        )

    def evict(self, ids: np.ndarray) -> int:
        self.reserve_events()
        return self.kernels.evict_blocks(
            self.blk, self.blk64, self.ent, self.keys, self.table, self.meta, self.events, ids,
            self.enable_events,
        )

    def reset(self) -> tuple[int, np.ndarray]:
        """``(code, fired buffer)``; :meth:`result` says whether the reset happened."""
        self.reserve_events()
        fired = np.empty(self.num_watchers(), np.int64)
        code = self.kernels.reset_prefix_cache(
            self.blk, self.blk64, self.ent, self.keys, self.table, self.meta, self.events,
            fired, self.enable_events,
        )
        return code, fired

    def writable(self, b: int) -> bool:
        return bool(self.kernels.block_is_writable(self.blk, b))

    # -- event records ------------------------------------------------------------------------

    def drain_events(self) -> list[tuple[int, int, int, bytes | None]]:
        """``(kind, payload, seq, removed key bytes)`` per record of the last call, then free
        the key rows those records kept readable."""
        count = self.meta.item(k.M_EV_LEN)
        if not count:
            return []
        if count <= 8:  # a decode step's record or two: element reads beat array slices
            return self._drain_few(count)
        rows = self.events[:count].tolist()
        # The removed keys' rows in one gather (an eviction burst removes thousands), cut
        # into bytes in Python: numpy scalar reads per key cost more than the copy.
        removed = [payload for kind, payload, _ in rows if kind == k.EV_REMOVED]
        keys: list[bytes] = []
        if removed:
            lengths = self.keys[removed, k.K_LEN].tolist()
            width = self.key_bytes.shape[1]
            blob = self.key_bytes[removed].tobytes()
            keys = [blob[i * width : i * width + n] for i, n in enumerate(lengths)]
        out: list[tuple[int, int, int, bytes | None]] = []
        next_key = iter(keys).__next__
        for kind, payload, seq in rows:
            out.append((kind, payload, seq, next_key() if kind == k.EV_REMOVED else None))
        self.kernels.release_removed_keys(self.keys, self.meta, self.events)
        return out

    def take_stored(self, seq: int) -> bool:
        """Drain the last call's records if they are exactly one ``BlockStored`` numbered
        ``seq`` (a cache write that only keyed; it kept no key row to free); ``False``,
        nothing drained, otherwise."""
        if (self.meta.item(k.M_EV_LEN) == 1 and self.events.item(0, k.EV_KIND) == k.EV_STORED
                and self.events.item(0, k.EV_SEQ) == seq):
            self.meta[k.M_EV_LEN] = 0
            return True
        return False

    def _drain_few(self, count: int) -> list[tuple[int, int, int, bytes | None]]:
        """:meth:`drain_events` of a few records, read element by element."""
        row, key_len, key_bytes = self.events.item, self.keys.item, self.key_bytes
        out: list[tuple[int, int, int, bytes | None]] = []
        for r in range(count):
            kind, payload = row(r, k.EV_KIND), row(r, k.EV_PAYLOAD)
            key = None
            if kind == k.EV_REMOVED:
                key = key_bytes[payload, : key_len(payload, k.K_LEN)].tobytes()
            out.append((kind, payload, row(r, k.EV_SEQ), key))
        self.kernels.release_removed_keys(self.keys, self.meta, self.events)
        return out

    def report_removals(self) -> list[list[int]] | None:
        """The last call's records as ``[group id, external hash bits, seq]`` rows when all
        are removals (:func:`~kvpool.fast.kernels.report_removals`: the caller masks the
        hash to 64 unsigned bits), their key rows then freed; ``None``, nothing drained,
        otherwise. One kernel call and one ``tolist`` for a decode step's eviction or a
        burst of thousands (``removal_rows`` has a row per record: it grows with
        ``events``)."""
        rows = self.removal_rows
        count = self.kernels.report_removals(self.keys, self.key_bytes, self.meta, self.events,
                                             rows)
        if count < 0:
            return None
        return rows[:count].tolist()  # type: ignore[no-any-return]

    def drain_removals(self) -> tuple[list[int], list[bytes], list[int]] | None:
        """An eviction burst's records read in bulk for events with ``bytes`` hashes:
        ``(seqs, block hashes, group ids)`` when every record of the last call is a removal
        of a key of one length (hash at least 8 bytes), then the key rows freed as
        :meth:`drain_events` frees them; ``None``, nothing drained, otherwise. The hashes
        are what :meth:`~kvpool.events.EventContext.external_of_key` gives, sliced from the
        key rows as one array (integer hashes: :meth:`report_removals`)."""
        count = self.meta.item(k.M_EV_LEN)
        rows = self.events[:count]
        if not count or (rows[:, k.EV_KIND] != k.EV_REMOVED).any():
            return None
        kids = rows[:, k.EV_PAYLOAD]
        lengths = self.keys[kids, k.K_LEN]
        width = int(lengths[0])
        if width < GROUP_ID_BYTES + 8 or (lengths != width).any():
            return None
        rows_bytes = self.key_bytes[kids, :width]
        groups = rows_bytes[:, width - GROUP_ID_BYTES :].copy().view(">u4").ravel().tolist()
        n = width - GROUP_ID_BYTES
        blob = rows_bytes[:, :n].tobytes()
        hashes = [blob[i : i + n] for i in range(0, len(blob), n)]
        seqs = rows[:, k.EV_SEQ].tolist()
        self.kernels.release_removed_keys(self.keys, self.meta, self.events)
        return seqs, hashes, groups

    def next_event_seq(self) -> int:
        """Take the next event sequence number (for events built without a kernel)."""
        seq = int(self.meta[k.M_EVENT_COUNT])
        self.meta[k.M_EVENT_COUNT] = seq + 1
        return seq

    # -- reads --------------------------------------------------------------------------------

    def num_free(self) -> int:
        return self.meta.item(k.M_NUM_FREE)

    def num_watchers(self) -> int:
        return self.meta.item(k.M_NUM_WATCHERS)

    def err_index(self) -> int:
        return self.meta.item(k.M_ERR_INDEX)

    def result(self) -> int:
        return self.meta.item(k.M_RESULT)

    def fired(self, buffer: np.ndarray) -> tuple[int, ...]:
        return tuple(buffer[: int(self.meta[k.M_FIRED_LEN])].tolist())

    def ref_cnt(self, block_id: int) -> int:
        return int(self.blk[block_id, k.REF])
