"""``FastBlockPool``: the Numba array backend behind the shared public pool API.

Contract: observably identical to :class:`kvpool.spec.pool.SpecPool` — results, error types
and messages (checked in the order of :mod:`kvpool.spec.preconditions`), queue order, events
and their sequence numbers, watcher order — only faster. Bookkeeping lives in the arrays
only. Two layers: :class:`~kvpool.fast.core.FastCore` runs the generic shell's core
operations on :class:`~kvpool.fast.state.FastState` (codes become typed errors, records
become :mod:`kvpool.spec.records`); this class adds the lean public paths.

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
* :meth:`FastBlockPool.take_and_key` — a running step's block boundary (take blocks, key the
  one that filled) in one kernel call, or ``None`` with nothing changed where the two verbs
  must run (the fast policy's, :mod:`kvpool.policy.fast`);
* :meth:`FastBlockPool.group_step` — a hybrid model's running step (the windows' frees,
  every group's new blocks, every group's filled block keyed) in one kernel call, or
  ``None`` with nothing changed (the hybrid fast policy's, :mod:`kvpool.policy.fast_hybrid`);
* :meth:`FastBlockPool.check_invariants`, :meth:`FastBlockPool.memory_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kvpool.errors import (
    DoubleFree,
    NoFreeBlocks,
)
from kvpool.fast import kernels as k
from kvpool.fast.convert import hash_buffer, uniform_lens
from kvpool.fast.core import FastCore
from kvpool.fast.verbs import FastBatchVerbs
from kvpool.hash_list import LIST_TYPES as _HASH_LISTS
from kvpool.hash_list import BlockHashList
from kvpool.keys import MAX_GROUP_ID
from kvpool.spec.state import NULL_BLOCK_ID

_INT_ONLY = {int}
_BYTES_ONLY = {bytes}
_LIST_OR_TUPLE = (list, tuple)
_INT64 = np.dtype(np.int64)


class FastBlockPool(FastBatchVerbs, FastCore):
    """The fast backend (see module docstring). ``jit=False`` runs the same kernels as plain
    Python (slow; for tests and debugging)."""

    backend_name = "fast"
    # 44 bytes of block arrays, plus about 164 for a fully cached pool's key rows (kernels.py)
    bytes_per_block = 208

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
                    event, seq = self._event_before(request, hashes, num_cached, num_full,
                                                    block_size, kv_cache_group_id)
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
            if len(values) == 1 and type(h := hashes[num_cached]) is bytes:
                buf, lens, max_len = (np.frombuffer(h, np.uint8), uniform_lens(1, len(h)),
                                      len(h))
            elif type(hashes) is BlockHashList and (view := hashes.packed(num_full)) is not None:
                max_len = hashes.width  # the packed companion: a view, no pass over the hashes
                buf, lens = view[num_cached * max_len :], uniform_lens(len(values), max_len)
            elif set(map(type, selected := hashes[num_cached:num_full])) == _BYTES_ONLY:
                buf, lens, max_len = hash_buffer(selected, all_bytes=True)
            else:  # a hash that is not bytes: the shell's checks say which, in spec order
                return super().cache_full_blocks(request, blocks, num_cached_blocks,
                                                 num_full_blocks, block_size, kv_cache_group_id)
            event = None
            if self.enable_kv_cache_events:
                selected = hashes[num_cached:num_full]  # read now, as every other path does
                if NULL_BLOCK_ID in values:  # the event skips null blocks: built after
                    self.check_reportable(request, hashes, len(blocks), num_cached, num_full,
                                          block_size, kv_cache_group_id, None)
                else:  # every position is keyed: the event is built once, beforehand
                    event, seq = self._event_before(request, hashes, num_cached, num_full,
                                                    block_size, kv_cache_group_id)
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

    def take_and_key(self, request: Any, blocks: list[int], num_blocks: int,
                     num_cached_blocks: int, num_full_blocks: int, block_size: int,
                     kv_cache_group_id: int) -> list[int] | None:
        """``new = get_new_blocks(num_blocks)``, then ``cache_full_blocks(request, blocks +
        new, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id)``, in one
        kernel call: a running request's step across a block boundary
        (:func:`~kvpool.fast.kernels.take_and_key`: the one block that filled), or an
        admission (:func:`~kvpool.fast.kernels.allocate_and_cache`: the prompt's full blocks,
        hashes read from the request's packed digests). Returns ``new``, or ``None`` with
        nothing changed when it does not run so: the pool reports events, has a metrics
        collector or a pending watcher, or an argument is not the plain case (a block that
        already has a key, hashes that are not one width of ``bytes``, a count out of
        range, ...); the caller then runs the two verbs, which do it or say why.
        O(num_blocks + blocks keyed)."""
        n, num_cached, num_full, group = (num_blocks, num_cached_blocks, num_full_blocks,
                                          kv_cache_group_id)
        if (self._delivering or not self._st._quiet_first or self.metrics_collector is not None
                or n.__class__ is not int or num_cached.__class__ is not int
                or num_full.__class__ is not int or blocks.__class__ is not list
                or group.__class__ is not int or block_size.__class__ is not int
                or block_size != self.hash_block_size or not 0 < n <= self.num_gpu_blocks
                or not 0 <= num_cached < num_full <= len(blocks) + n
                or not 0 <= group <= MAX_GROUP_ID):
            return None
        hashes: Any = getattr(request, "block_hashes", None)
        if type(hashes) not in _HASH_LISTS or num_full > len(hashes):
            return None
        held = len(blocks)
        if num_full == num_cached + 1 and num_cached < held:  # a decode step's boundary
            b, h = blocks[num_cached], hashes[num_cached]
            if b.__class__ is not int or h.__class__ is not bytes or not 0 < b < 2**63:
                return None
            first = (self._st._take_and_key or self._st.take_and_key_kernel())(
                n, b, h, num_cached, group)
            if first < 0:
                return None
            return [first] if n == 1 else self._out[:n].tolist()
        view = hashes.packed(num_full) if type(hashes) is BlockHashList else None
        if view is None:
            return None
        old = blocks[num_cached:num_full] if num_cached < held else ()  # held candidates
        if old and set(map(type, old)) != _INT_ONLY:
            return None
        width, m = hashes.width, num_full - num_cached
        cand = np.empty(m, np.int64)
        try:
            cand[: len(old)] = old
        except OverflowError:
            return None
        code = self._st.allocate_and_cache(
            n, cand, len(old), max(0, num_cached - held), None, view[num_cached * width :],
            uniform_lens(m, width), width, num_cached, 1, group, False)
        if code:
            return None
        return self._out[:n].tolist()

    def group_step(self, releases: Sequence[list[int]], num_new_blocks: int, reserve: int,
                   writes: Sequence[tuple[int, bytes, int, int]]) -> list[int] | None:
        """``free_blocks(ids)`` for each list of ``releases`` in turn; then, when
        ``num_new_blocks + reserve`` blocks are free, ``new = get_new_blocks(num_new_blocks)``
        and, for each write ``(block, block_hash, position, group)``, the one-block
        ``cache_full_blocks`` of ``block`` at table ``position`` keyed ``block_hash`` (block
        size = hash block size) — in one kernel call (:func:`~kvpool.fast.kernels.
        group_step`): a running request's step across a hybrid model's groups, in the
        generic policy's order. Returns ``new``, or ``None`` with nothing changed when it
        does not run so: the pool reports events, has no prefix cache, a metrics collector
        or a pending watcher, fewer free blocks than asked (the caller's budget refuses),
        or an argument that is not the plain case (a write's block released, not held or
        already keyed, an id twice, a count or id out of range, a hash that is not
        ``bytes``); the caller then runs the verbs, which do it or say why.
        O(released + new + written)."""
        n = num_new_blocks
        st = self._st
        if (self._delivering or not st._quiet_first or self.metrics_collector is not None
                or n.__class__ is not int or reserve.__class__ is not int
                or not 0 <= n <= self.num_gpu_blocks or reserve < 0):
            return None
        plan: list[Any] = [len(releases)]
        for ids in releases:
            if ids.__class__ is not list:
                return None
            plan.append(len(ids))
        plan.append(len(writes))
        hashes = []
        for b, h, position, group in writes:
            # Only ints: numpy would turn True or 1.5 into an id.
            if (h.__class__ is not bytes or b.__class__ is not int
                    or position.__class__ is not int or group.__class__ is not int):
                return None
            plan += (b, position, group, len(h))
            hashes.append(h)
        for ids in releases:
            for b in ids:  # (a window frees a block or two per step)
                if b.__class__ is not int:
                    return None
            plan += ids
        try:
            plan_arr = np.array(plan, np.int64)
        except OverflowError:
            return None
        buf = np.frombuffer(b"".join(hashes), np.uint8) if hashes else st.no_mask
        if (st._group_step or st.group_step_kernel())(plan_arr, buf, n, reserve) != k.OK:
            return None
        return self._out[:n].tolist() if n else []

    def _event_before(self, request: Any, hashes: Any, num_cached: int, num_full: int,
                      block_size: int, group: int) -> tuple[Any, int]:
        """A cache write's ``BlockStored`` and the sequence number it carries, built before
        the write (so a request no event can describe is refused with the pool unmoved)."""
        seq = self._meta.item(k.M_EVENT_COUNT)
        event, error = self._events.stored_before(request, hashes, num_cached, num_full,
                                                  block_size, group, seq)
        if error is not None:
            raise error
        return event, seq

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
