"""The fast pool's batch verbs: one kernel call each (definitions: :mod:`kvpool.batch`).

Contract: each method returns what its generic twin in :mod:`kvpool.batch` returns on this
pool and leaves the same state, events, metrics calls and watcher calls. A *lean path*
handles the common call — plain ints, int lists or int64 arrays, ``bytes`` hashes, no metrics
collector, no pending reuse watcher where blocks are allocated — with one kernel call;
every other call runs the generic composition on this pool, so its behaviour is the
definition by construction. A kernel validates everything before it writes; when it refuses
a call, the error raised is the one :mod:`kvpool.batch`'s own checks find, so every error of
a batch verb has one definition.

The cost that remains per call is Python's: type checks of what the kernel will read, the
conversion of the blocks and hashes it reads to arrays (only those: a step reads one
candidate per filled block, not the whole table), and the result list.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import is_
from typing import TYPE_CHECKING, Any

import numpy as np

from kvpool import batch
from kvpool.batch.checks import write_rejection
from kvpool.fast import kernels as k
from kvpool.fast.convert import hash_buffer, uniform_lens
from kvpool.hash_list import LIST_TYPES as _HASH_LISTS
from kvpool.hash_list import BlockHashList
from kvpool.keys import MAX_GROUP_ID
from kvpool.shell import as_group_ids, as_mask, candidate_table, request_block_hashes
from kvpool.shell.arguments import as_pool_block_ids
from kvpool.spec.records import RemovedRecord

if TYPE_CHECKING:
    from kvpool.fast.state import FastState

_INT_ONLY = {int}
_BYTES_ONLY = {bytes}
_INT64 = np.dtype(np.int64)
_NDARRAY = np.ndarray
_NO_BYTES = np.empty(0, np.uint8)
_NO_LENS = uniform_lens(0, 0)
_MAX_RESERVE = 2**62  # larger reserves (never admitted) take the generic path
_GENERIC = object()  # a lean path's answer: take the generic path


def _plain_group_ids(ids: Any) -> tuple[int, ...]:
    """``ids`` as a tuple when it is a non-empty list or tuple of plain, valid group ids
    (what the range lookups' lean paths take); ``()`` otherwise (the composition checks)."""
    groups = tuple(ids) if type(ids) is list or type(ids) is tuple else ()
    if groups and set(map(type, groups)) == _INT_ONLY and min(groups) >= 0 \
            and max(groups) <= MAX_GROUP_ID:
        return groups
    return ()


class _FastObserver:
    """:class:`kvpool.batch.Observer` over the fast pool's arrays (O(1) per fact)."""

    def __init__(self, st: FastState, hash_block_size: int) -> None:
        self.blk, self.blk64, self.hbs = st.blk, st.blk64, hash_block_size
        self.kernels = st.kernels

    def ref_cnts(self, block_ids: list[int]) -> list[int]:
        if not block_ids:
            return []
        return self.blk[block_ids, k.REF].tolist()

    def key_tokens(self, block_id: int) -> int | None:
        if k._first(self.blk, block_id) == -1:
            return None
        return int(self.blk64[block_id, k.TOKENS]) * self.hbs

    def max_key_tokens(self, block_ids: Sequence[int]) -> int:
        # One kernel over the ids (a request's table, a hundred blocks): numpy's gathers
        # cost more than the conversion and the call together. Anything but an int array
        # of this pool's ids takes the checked conversion, which names what is wrong.
        if not len(block_ids):
            return 0
        n = self.blk.shape[0] - 2
        ids = np.array(block_ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            ids = np.array(as_pool_block_ids(block_ids, n), np.int64)
        longest = self.kernels.max_key_tokens(self.blk, self.blk64,
                                              ids.astype(np.int64, copy=False))
        if longest < 0:  # an id outside the pool (raised here), or a uint64 wrapped
            ids = np.array(as_pool_block_ids(block_ids, n), np.int64)
            longest = self.kernels.max_key_tokens(self.blk, self.blk64, ids)
        return longest * self.hbs

    def queue_front(self, n: int) -> list[int]:
        blk, out = self.blk, []
        b = k._next(blk, blk.shape[0] - 2)
        for _ in range(n):
            out.append(b)
            b = k._next(blk, b)
        return out


def _packed(hashes: list[Any]) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``bytes`` hashes back to back with their lengths and the longest; ``None`` if one is
    not bytes (exactly the hashes the generic verb accepts, subclasses aside: those take
    the generic path too)."""
    if set(map(type, hashes)) - _BYTES_ONLY:
        return None
    buf = np.frombuffer(b"".join(hashes), np.uint8) if hashes else _NO_BYTES
    widths = set(map(len, hashes))
    if len(widths) == 1:
        width = widths.pop()
        return buf, uniform_lens(len(hashes), width), width
    if not widths:
        return buf, uniform_lens(0, 0), 0
    lens = np.fromiter(map(len, hashes), np.int64, len(hashes))
    return buf, lens, int(lens.max())


class FastBatchVerbs:
    """Mixed into :class:`~kvpool.fast.pool.FastBlockPool` (see the module docstring)."""

    _st: FastState
    _out: np.ndarray
    enable_caching: bool
    enable_kv_cache_events: bool
    hash_block_size: int
    num_gpu_blocks: int
    metrics_collector: Any
    _events: Any
    _delivering: bool
    _last_pack: tuple | None = None  # _packed_prefix's memory: (list, its hashes, packed)
    _last_view: tuple | None = None  # ... of a companion: (list, its buffer, count, packed)
    _memo: np.ndarray | None = None  # _scan_memo: (key row, generation) per hit position
    _memo_len = 0
    _memo_source: Any = None  # _scan_memo: where the remembered hashes came from
    _memo_group = -1

    def observe(self) -> batch.Observer:
        """Facts about blocks for :mod:`kvpool.batch`'s up-front checks. O(1) per fact."""
        return _FastObserver(self._st, self.hash_block_size)

    # -- lookup and single-request allocation -------------------------------------------

    def find_longest_cache_hit(self, block_hashes: Any, kv_cache_group_ids: Sequence[int],
                               max_num_blocks: int | None = None) -> list[list[int]]:
        """Blocks of the longest prefix of ``block_hashes`` cached in every group; see
        :func:`kvpool.batch.find_longest_cache_hit`. One kernel call. O(hits · groups)."""
        ids = kv_cache_group_ids
        groups_t = tuple(ids) if type(ids) is list or type(ids) is tuple else as_group_ids(ids)
        lean = self._lean_lookup_buffer(block_hashes, groups_t, max_num_blocks)
        if lean is not None:  # the common call: one group, a list of bytes of one width
            buf, lens, _ = lean
            groups, out = self._lookup_arrays(groups_t, len(lens))  # type: ignore[attr-defined]
            code = self._st.lookup(buf, lens, groups, out)
            if code:
                raise self._internal(code)  # type: ignore[attr-defined]
            return out[:, : self._st.result()].tolist()
        hashes = batch.check_lookup_arguments(block_hashes, groups_t, max_num_blocks)
        if isinstance(hashes, np.ndarray):
            q, width = hashes.shape
            buf = np.ascontiguousarray(hashes).reshape(-1)
            lens = np.full(q, width, np.int64)
        else:
            q = len(hashes)
            buf, lens, _ = hash_buffer(hashes)
        groups, out = self._lookup_arrays(groups_t, q)  # type: ignore[attr-defined]
        code = self._st.lookup(buf, lens, groups, out)
        if code:
            raise self._internal(code)  # type: ignore[attr-defined]
        return out[:, : self._st.result()].tolist()

    def get_cached_blocks(self, block_hashes: Any, kv_cache_group_ids: Sequence[int],
                          start: int, stop: int) -> list[list[int] | None]:
        """``get_cached_block`` for each position of ``[start, stop)``; see
        :func:`kvpool.batch.get_cached_blocks`. One kernel call. O((stop - start) · groups)."""
        ids = kv_cache_group_ids
        groups_t = _plain_group_ids(ids)
        lean = None
        if (groups_t and type(start) is int and type(stop) is int
                and type(block_hashes) in _HASH_LISTS and 0 <= start < stop <= len(block_hashes)):
            lean = self._range_buffer(block_hashes, start, stop)
        if lean is None:  # the checked composition: its errors, or an empty range
            return batch.get_cached_blocks(self, block_hashes, ids, start, stop)
        buf, lens, _ = lean
        n = stop - start
        groups, out = self._lookup_arrays(groups_t, n)  # type: ignore[attr-defined]
        code = self._st.lookup_each(buf, lens, groups, out)
        if code:
            raise self._internal(code)  # type: ignore[attr-defined]
        if len(groups_t) == 1:
            return [None if b < 0 else [b] for b in out[0, :n].tolist()]
        rows = out[: len(groups_t), :n].T.tolist()
        return [row if row[0] >= 0 else None for row in rows]

    def cached_run_from_end(self, block_hashes: Any, kv_cache_group_ids: Sequence[int],
                            stop: int, run_length: int, end_every: int = 1,
                            end_shift: int = 0) -> tuple[int, list[list[int]]]:
        """The rightmost run of ``run_length`` hits that may end where it ends; see
        :func:`kvpool.batch.cached_run_from_end`. One kernel call (a packed companion's
        digests read in place). O(positions read · groups)."""
        ids = kv_cache_group_ids
        groups_t = _plain_group_ids(ids)
        lean = None
        if (groups_t and type(block_hashes) in _HASH_LISTS and type(stop) is int
                and type(run_length) is int and type(end_every) is int
                and type(end_shift) is int and 0 < stop <= len(block_hashes)
                and run_length >= 1 and end_every >= 1 and end_shift >= 0):
            lean = self._range_buffer(block_hashes, 0, stop)
        if lean is None:  # the checked composition: its errors, or an empty range
            return batch.cached_run_from_end(self, block_hashes, ids, stop, run_length,
                                             end_every, end_shift)
        buf, lens, _ = lean
        groups, out = self._lookup_arrays(groups_t, stop)  # type: ignore[attr-defined]
        first = self._st.lookup_run_from_end(buf, lens, groups, out, run_length, end_every,
                                             end_shift)
        if first < 0:
            raise self._internal(-first)  # type: ignore[attr-defined]
        return first, out[: len(groups_t), first : self._st.result()].tolist()

    @staticmethod
    def _range_buffer(block_hashes: Any, start: int, stop: int
                      ) -> tuple[np.ndarray, np.ndarray, int] | None:
        """The kernel's (buffer, lengths, longest length) for hashes ``[start, stop)`` when
        every one is ``bytes`` (the packed companion: no pass); ``None`` otherwise."""
        if type(block_hashes) is BlockHashList:
            view = block_hashes.packed(stop)
            if view is not None:
                width = block_hashes.width
                return view[start * width :], uniform_lens(stop - start, width), width
        window = block_hashes if start == 0 and stop == len(block_hashes) \
            else block_hashes[start:stop]
        if set(map(type, window)) != _BYTES_ONLY:
            return None
        return hash_buffer(window, all_bytes=True)

    @staticmethod
    def _lean_lookup_buffer(block_hashes: Any, groups: tuple[Any, ...],
                            max_num_blocks: int | None
                            ) -> tuple[np.ndarray, np.ndarray, int] | None:
        """The kernel's (buffer, lengths, longest length) for a lookup every check of
        :func:`kvpool.batch.check_lookup_arguments` passes — one valid group, no limit or a
        positive int one, a non-empty list whose (first ``max_num_blocks``) entries are
        ``bytes`` — in one pass of each kind (a packed companion: none); ``None`` otherwise
        (the checked path then decides)."""
        if (len(groups) != 1 or type(groups[0]) is not int
                or not 0 <= groups[0] <= MAX_GROUP_ID or type(block_hashes) not in _HASH_LISTS
                or not block_hashes):
            return None
        n = len(block_hashes)
        if max_num_blocks is not None:  # the scan stops there: only those are checked
            if type(max_num_blocks) is not int or max_num_blocks <= 0:
                return None
            n = min(n, max_num_blocks)
        return FastBatchVerbs._range_buffer(block_hashes, 0, n)

    def allocate_and_cache(self, request: Any, blocks: Sequence[object], num_new_blocks: int,
                           num_cached_blocks: int, num_full_blocks: int, block_size: int,
                           kv_cache_group_id: int,
                           block_mask: Sequence[object] | None = None) -> list[int]:
        """Allocate a request's new blocks and key its full ones in one kernel call; see
        :func:`kvpool.batch.allocate_and_cache`. Nothing changes when it raises.

        With a metrics collector or a pending reuse watcher the composition runs, so that
        callbacks fire between the two verbs. O(new + candidates).
        """
        if self._delivering:
            self._refuse_reentry("allocate_and_cache")  # type: ignore[attr-defined]
        if self.metrics_collector is not None or self._st.num_watchers():
            return batch.allocate_and_cache(self, request, blocks, num_new_blocks,
                                            num_cached_blocks, num_full_blocks, block_size,
                                            kv_cache_group_id, block_mask)
        n = int(num_new_blocks) if isinstance(num_new_blocks, np.integer) else num_new_blocks
        error = batch.allocation_rejection(n, self._st.num_free())
        if error:
            raise error
        hashes = request_block_hashes(request)
        table = blocks if isinstance(blocks, (list, tuple)) else list(blocks)
        mask = as_mask(block_mask)
        num_cached, num_full = num_cached_blocks, num_full_blocks
        ratio = self._cache_arguments(hashes, len(table) + n, num_cached,  # type: ignore[attr-defined]
                                      num_full, block_size, kv_cache_group_id, mask)
        # After the argument checks, as the composition converts ``blocks``: its candidates
        # only (shell.candidate_table; a list of plain ints needs no conversion).
        head = table[num_cached:num_full] if ratio else ()
        old: Sequence[Any]
        if type(table) is list and set(map(type, head)) <= _INT_ONLY:
            old = table
        else:
            old = candidate_table(self._local_ids, table,  # type: ignore[attr-defined]
                                  num_cached, num_full)
        if not ratio:
            return self.get_new_blocks(n)  # type: ignore[attr-defined]
        # The hashes the write reads, packed: a list of bytes (or its packed companion) at
        # block size = hash block size in one pass (none), anything else after the checks.
        packed = self._range_buffer(hashes, num_cached, num_full) if ratio == 1 else None
        if packed is None or self.enable_kv_cache_events:  # (packed: every hash is bytes)
            error = write_rejection(self, request, hashes, num_cached, num_full, block_size,
                                    kv_cache_group_id)
            if error:
                raise error
        old_cand = old[num_cached:num_full]
        cand = np.empty(num_full - num_cached, np.int64)
        try:
            cand[: len(old_cand)] = old_cand
        except OverflowError:
            raise self._first_bad_id(old_cand) from None  # type: ignore[attr-defined]
        first_new = max(0, num_cached - len(old))
        selected = hashes[num_cached * ratio + ratio - 1 : num_full * ratio : ratio] \
            if packed is None or self.enable_kv_cache_events else ()  # (the event reads them)
        buf, lens, max_len = packed if packed is not None else hash_buffer(selected)
        mask_arr = None if mask is None else np.array(mask, dtype=np.uint8).reshape(-1)
        code = self._st.allocate_and_cache(n, cand, len(old_cand), first_new, mask_arr, buf,
                                           lens, max_len, num_cached, ratio, kv_cache_group_id,
                                           False)
        if code:
            raise self._candidate_error(code, cand, num_cached,  # type: ignore[attr-defined]
                                        block_size)
        new = self._out[:n].tolist()
        if self.enable_kv_cache_events:
            self._record_call([(request, self._stored(  # type: ignore[attr-defined]
                selected, cand.tolist(), mask, num_cached, num_full, block_size,
                kv_cache_group_id))])
        return new

    # -- admission ---------------------------------------------------------------------------

    def admit(self, request: Any, max_hit_blocks: int, num_blocks: int, num_full_blocks: int,
              reserve_blocks: int, block_size: int,
              kv_cache_group_id: int) -> tuple[list[int], list[int]] | None:
        """A new request's lookup, admission test, touch, allocation and caching in one
        kernel call; see :func:`kvpool.batch.admit`. O(hits + num_blocks)."""
        if self._delivering:
            self._refuse_reentry("admit")  # type: ignore[attr-defined]
        result = self._admit_lean(None, request, max_hit_blocks, num_blocks, num_full_blocks,
                                  reserve_blocks, block_size, kv_cache_group_id)
        if result is not _GENERIC:
            return result
        return batch.admit(self, request, max_hit_blocks, num_blocks, num_full_blocks,
                           reserve_blocks, block_size, kv_cache_group_id)

    def admit_into(self, request: Any, table: Any, max_hit_blocks: int, num_blocks: int,
                   num_full_blocks: int, reserve_blocks: int, block_size: int,
                   kv_cache_group_id: int) -> int | None:
        """:meth:`admit` writing the table into ``table[:num_blocks]``; the number of hits,
        or ``None``. See :func:`kvpool.batch.admit_into`. The ids are copied once, array to
        array: no list is built. O(hits + num_blocks)."""
        if self._delivering:
            self._refuse_reentry("admit_into")  # type: ignore[attr-defined]
        if (type(table) is _NDARRAY and table.dtype is _INT64 and table.ndim == 1
                and type(num_blocks) is int and 0 <= num_blocks <= table.shape[0]
                and table.flags.writeable):
            result = self._admit_lean(table, request, max_hit_blocks, num_blocks,
                                      num_full_blocks, reserve_blocks, block_size,
                                      kv_cache_group_id)
            if result is not _GENERIC:
                return result
        return batch.admit_into(self, request, table, max_hit_blocks, num_blocks,
                                num_full_blocks, reserve_blocks, block_size, kv_cache_group_id)

    def _admit_lean(self, into: np.ndarray | None, request: Any, max_hit_blocks: int,
                    num_blocks: int, num_full_blocks: int, reserve_blocks: int,
                    block_size: int, kv_cache_group_id: int) -> Any:
        """The admission as one kernel call, when the arguments take the lean path: the
        result of :meth:`admit` (``into`` None) or of :meth:`admit_into` (the table written
        into ``into``, checked by the caller), ``None`` when refused, or ``_GENERIC`` for
        the generic path (which also finds any error)."""
        hashes: Any = getattr(request, "block_hashes", None)
        if not (type(max_hit_blocks) is int and type(num_blocks) is int
                and type(num_full_blocks) is int and type(reserve_blocks) is int
                and type(kv_cache_group_id) is int and type(block_size) is int
                and block_size == self.hash_block_size
                and 0 <= max_hit_blocks <= num_blocks <= self.num_gpu_blocks
                and 0 <= num_full_blocks <= num_blocks and 0 <= reserve_blocks < _MAX_RESERVE
                and 0 <= kv_cache_group_id <= MAX_GROUP_ID and self.metrics_collector is None
                and type(hashes) in _HASH_LISTS and num_full_blocks <= len(hashes)
                and not (self.enable_kv_cache_events and self.enable_caching and write_rejection(
                    self, request, hashes, 0, num_full_blocks, block_size, kv_cache_group_id))):
            return _GENERIC
        read = max(max_hit_blocks, num_full_blocks)
        source: Any = None  # what the hashes came from: the memo's key (see _scan_memo)
        buf: Any
        if not self.enable_caching:
            buf, lens, max_len = _NO_BYTES, _NO_LENS, 0
        elif type(hashes) is BlockHashList and 0 < read <= hashes.packed_count:
            # The companion covers every hash read: its buffer as it is, no view, no pass
            # (the kernel reads the first ``read`` digests; bytes once packed never change).
            buf = source = hashes.buffer
            max_len = hashes.width
            lens = uniform_lens(read, max_len)
        else:
            source = self._packed_prefix(hashes, read)
            if source is None:
                return _GENERIC
            buf, lens, max_len = source
        memo, known = self._scan_memo(source, kv_cache_group_id, num_blocks)
        st = self._st
        code = st.admit(memo, known, buf, lens, max_len, max_hit_blocks, num_blocks,
                        num_full_blocks, reserve_blocks, 1, kv_cache_group_id)
        self._memo_len = st.result() if code in (k.OK, k.REFUSED) else 0
        if code == k.OK:
            h = st.result()
            out = self._out
            if into is None:
                ids = out[:num_blocks].tolist()
                result: Any = (ids[:h], ids[h:])
            else:
                into[:num_blocks] = out[:num_blocks]
                result = h
            if self.enable_kv_cache_events:
                self._record_call([(request, self._stored(  # type: ignore[attr-defined]
                    hashes[h:num_full_blocks], out[h:num_full_blocks].tolist(), None, h,
                    num_full_blocks, block_size, kv_cache_group_id))])
            return result
        if code == k.REFUSED:
            return None
        if code != k.NEED_FULL:
            raise self._internal(code)  # type: ignore[attr-defined]
        return _GENERIC

    def _scan_memo(self, source: Any, group: int, num_blocks: int) -> tuple[np.ndarray, int]:
        """The memo of the last admission scan, and how many of its positions apply: all
        the valid ones when the hashes come from the very same ``source`` in the same group
        (a waiting request asking again), else none. The kernel re-checks each position by
        key generation.

        ``source`` is a companion's buffer or a packed tuple: its first digests never change
        while it lives, and it is kept here, so its identity cannot pass to another object.
        """
        memo = self._memo
        if memo is None or memo.shape[1] < num_blocks:
            size = max(num_blocks, 64, 0 if memo is None else 2 * memo.shape[1])
            memo = self._memo = np.zeros((2, size), np.int64)
            self._memo_len = 0
        known = self._memo_len if (self._memo_source is source
                                   and self._memo_group == group) else 0
        self._memo_source = source
        self._memo_group = group
        return memo, known

    def _packed_prefix(self, hashes: list[Any], read: int) -> tuple | None:
        """:func:`_packed` of ``hashes[:read]``, remembered for the last list packed: a
        request that waits is admitted again every step, and packing dominates its Python
        cost. Reused only when every hash read is the very object packed before (``bytes``
        are immutable, so equal objects mean equal bytes).

        A :class:`~kvpool.hash_list.BlockHashList` whose companion covers ``hashes[:read]``
        gives a view of it instead, in O(1): no pass over the hashes. Remembered while its
        buffer is the same object (the packed prefix has not changed since)."""
        if type(hashes) is BlockHashList:
            view = hashes.packed(read)
            if view is not None:
                buffer, last = hashes.buffer, self._last_view
                if (last is not None and last[0] is hashes and last[1] is buffer
                        and last[2] == read):
                    return last[3]
                width = hashes.width if read else 0
                packed: tuple[np.ndarray, np.ndarray, int] | None = (
                    view, uniform_lens(read, width), width)
                self._last_view = (hashes, buffer, read, packed)
                return packed
        selected = hashes[:read] if read < len(hashes) else hashes
        last = self._last_pack
        if (last is not None and last[0] is hashes and len(last[1]) == len(selected)
                and all(map(is_, last[1], selected))):
            return last[2]
        packed = _packed(selected)
        if packed is not None:
            self._last_pack = (hashes, list(selected), packed)
        return packed

    # -- a step --------------------------------------------------------------------------

    def step(self, cache_items: Sequence[tuple[Any, Any, int, int]], num_new_blocks: int,
             free_tables: Sequence[Any], block_size: int, kv_cache_group_id: int) -> list[int]:
        """Cache what filled, allocate, free finished tables — one kernel call; see
        :func:`kvpool.batch.step`. O(candidates + new + table lengths).

        Lean path: ``block_size == hash_block_size``, plain int counts, tables as int64
        arrays or int lists, hashes in lists, no metrics collector, no pending watcher when
        allocating.
        """
        if self._delivering:
            self._refuse_reentry("step")  # type: ignore[attr-defined]
        # Read more than once below (plan, checks, events): a one-shot iterator would be
        # consumed by the first reader.
        if type(cache_items) is not list and type(cache_items) is not tuple:
            cache_items = list(cache_items)
        if type(free_tables) is not list and type(free_tables) is not tuple:
            free_tables = list(free_tables)
        n = num_new_blocks
        st = self._st
        if (type(n) is int and type(block_size) is int and type(kv_cache_group_id) is int
                and 0 <= n <= self.num_gpu_blocks and block_size == self.hash_block_size
                and 0 <= kv_cache_group_id <= MAX_GROUP_ID and self.metrics_collector is None
                and (n == 0 or not st.num_watchers())):
            plan = self._step_plan(cache_items, n, free_tables, kv_cache_group_id)
            if plan is not None:
                plan_arr, freed, buf, lens, max_len = plan
                # The bound kernel directly (st.step grows the arrays when it finds no room).
                code = (st._batch or st._batch_kernels())[1](
                    plan_arr, freed, buf, lens, 1, kv_cache_group_id, self.enable_caching,
                    self.enable_kv_cache_events)
                if code == k.ERR_CAPACITY:
                    code = st.step(plan_arr, freed, buf, lens, max_len, 1, kv_cache_group_id)
                if code:
                    raise batch.step_rejection(
                        self, cache_items, num_new_blocks, free_tables, block_size,
                        kv_cache_group_id,
                    ) or self._internal(code)  # type: ignore[attr-defined]
                if self.enable_kv_cache_events:
                    self._record_step(cache_items, block_size, kv_cache_group_id)
                return self._out[:n].tolist() if n else []
        return batch.step(self, cache_items, num_new_blocks, free_tables, block_size,
                          kv_cache_group_id)

    def cache_full_blocks_batch(self, cache_items: Sequence[tuple[Any, Any, int, int]],
                                block_size: int, kv_cache_group_id: int) -> None:
        """``cache_full_blocks`` per item in one kernel call; see
        :func:`kvpool.batch.cache_full_blocks_batch`."""
        self.step(cache_items, 0, (), block_size, kv_cache_group_id)

    def free_tables(self, tables: Sequence[Any]) -> None:
        """``free_blocks(table[::-1])`` per table in one kernel call; see
        :func:`kvpool.batch.free_tables`."""
        self.step((), 0, tables, self.hash_block_size, 0)

    def _step_plan(self, cache_items: Sequence[Any], n: int, free_tables: Sequence[Any],
                   group: int = 0) -> tuple | None:
        """The kernel's arguments for a lean step (ratio 1), or ``None`` for the generic path.

        Only a table's candidates are read (:func:`~kvpool.shell.candidate_table`, as the
        composition reads them): they alone are type-checked and copied. An item that caches
        nothing adds nothing to the plan.

        Python per item is what a step costs here (a decode step caches one block for each
        of a few requests): the item's checks, its candidate, its hash. The hashes are taken
        as objects, not from a packed companion: one per filled block, from as many
        requests, is one ``join``, cheaper than as many views. Their type and width are
        checked as they are taken (``width``: the common one, ``-2`` once two differ or one
        is not ``bytes``), so the common step skips :func:`hash_buffer`'s passes.
        """
        plan: list[int] = [0, n, len(free_tables)]
        hs: list[Any] = []
        width = -1
        if cache_items:
            if not self.enable_caching:
                return None
            events = self.enable_kv_cache_events
            m = 0
            try:
                for request, blocks, c, f in cache_items:
                    if type(c) is not int or type(f) is not int or c < 0 or f < 0:
                        return None
                    if type(blocks) is _NDARRAY:
                        if blocks.dtype is not _INT64 or blocks.ndim != 1:
                            return None
                        if c >= f:
                            continue
                    elif type(blocks) is list:
                        if c >= f:
                            continue
                        if set(map(type, blocks[c:f])) != _INT_ONLY:
                            return None
                    else:
                        return None
                    hashes = request.block_hashes
                    if f > len(blocks) or type(hashes) not in _HASH_LISTS or f > len(hashes):
                        return None
                    if events and write_rejection(self, request, hashes, c, f,
                                                  self.hash_block_size, group):
                        return None
                    if f - c == 1:  # one block filled: the common case
                        h = hashes[c]
                        plan += (c, 1, blocks[c])
                        hs.append(h)
                        if type(h) is not bytes or len(h) != width:
                            width = len(h) if width == -1 and type(h) is bytes else -2
                    else:
                        cand = blocks[c:f]
                        plan += (c, f - c, *(cand if type(cand) is list else cand.tolist()))
                        hs += hashes[c:f]
                        width = -2  # hash_buffer checks them
                    m += 1
            except (TypeError, ValueError, AttributeError):
                return None  # an item that is not a 4-sequence: the generic path says why
            plan[0] = m
        arrays = []
        for table in free_tables:
            if type(table) is np.ndarray:
                if table.dtype is not _INT64 or table.ndim != 1:
                    return None
            elif type(table) is not list or (table and set(map(type, table)) != _INT_ONLY):
                return None
            arrays.append(table)
            plan.append(len(table))
        try:
            plan_arr = np.array(plan, np.int64)
            if not arrays:
                freed = self._st.no_ids
            elif len(arrays) == 1:
                freed = np.ascontiguousarray(arrays[0], dtype=np.int64)
            else:
                freed = np.concatenate([np.asarray(a, dtype=np.int64) for a in arrays])
            if not hs:
                buf, lens, max_len = _NO_BYTES, _NO_LENS, 0
            elif width >= 0:  # every hash bytes of one width: join them, nothing to check
                buf = np.frombuffer(hs[0] if len(hs) == 1 else b"".join(hs), np.uint8)
                lens, max_len = uniform_lens(len(hs), width), width
            else:
                buf, lens, max_len = hash_buffer(hs)
        except (OverflowError, TypeError):
            return None  # an id beyond int64 or a hash that is not bytes-like: generic path
        return plan_arr, freed, buf, lens, max_len

    def _record_step(self, cache_items: Sequence[Any], block_size: int, group: int) -> None:
        """The records of a lean step: item ``payload`` of the caching ones (in order)."""
        stores = []
        for request, blocks, c, f in cache_items:
            if c < f:
                cand = list(blocks[c:f]) if type(blocks) is list else blocks[c:f].tolist()
                stores.append((request, self._stored(  # type: ignore[attr-defined]
                    request.block_hashes[c:f], cand, None, c, f, block_size, group)))
        self._record_call(stores)

    # -- events --------------------------------------------------------------------------

    def _record_call(self, stores: list[tuple[Any, Any]]) -> None:
        """Materialise the last kernel call's records: a ``StoredRecord`` from
        ``stores[payload]`` with that request (the composition's cache call records it so),
        a removal with none (its event does not depend on a request)."""
        for kind, payload, seq, key in self._st.drain_events():
            if kind == k.EV_REMOVED:
                assert key is not None  # drain_events reads the key of every removal
                self._events.record((RemovedRecord(seq, key),))
            elif kind == k.EV_STORED:
                request, make = stores[payload]
                self._events.record((make(seq),), request)
            else:
                raise AssertionError(f"unexpected event kind {kind} from a batch kernel")
