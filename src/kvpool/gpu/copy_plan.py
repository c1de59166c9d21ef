"""Block copy batches: validation, coalescing into runs, and the segments a kernel copies.

A batch is ``(src_block_id, dst_block_id, group_id)`` rows — the policy layer's
``BlockCopy`` list, or an int64 ``[n, 3]`` array — checked *as a whole* before anything
moves (BEHAVIOUR.md §12's rule), rule by rule in this order:

1. well-formed integer triples, groups in range (:class:`~kvpool.errors.InvalidGroupId`),
   ids inside each side's buffer (:class:`~kvpool.errors.InvalidBlockId`);
2. never the null block (:class:`~kvpool.gpu.errors.InvalidCopyPair`);
3. a destination named once, and never also a source of the batch — so the copies of one
   batch are independent and may run in any order, in parallel;
4. a destination still shared is refused: its holders, less the copy's own retentions, must
   be at most one (the table it is being copied for). Writing a block another request reads
   would corrupt that request.

Each rule reports the first pair that breaks it. Consecutive pairs (``src, src+1, …`` onto
``dst, dst+1, …`` of one group, in (group, source) order) merge into one run, and each run
becomes one segment per layer and per K/V in the flat buffer.

How: :class:`CopyPlanner` converts the rows (:func:`as_pair_array`) and hands them to **one**
jitted pass, :func:`kvpool.gpu.cpu_kernels.plan_copies`, which checks rules 1–4, merges
runs (radix-sorted: O(n), whatever the pool's size) and writes the segments; a failed rule
comes back as a code and this module raises its typed error. Rule 4's ref counts come from
``ref_cnts``: an integer array indexed by block id, read at each batch (a live view of the
pool's counts is fine; one kernel call), or a callback ``ids -> counts`` (the pool's
``observe().ref_cnts``). A callback is asked about the destinations only once rules 1–3
hold, so never about an id out of range: the kernel runs rules 1–3 first, then the whole
pass again with the counts (rules 1–3 cost ~7 ns a pair).
"""

from __future__ import annotations

import numbers
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Union

import numpy as np

from kvpool.errors import InvalidArgument, InvalidBlockId, InvalidGroupId
from kvpool.gpu import cpu_kernels as ck
from kvpool.gpu.errors import InvalidCopyPair
from kvpool.policy.facade import BlockCopy

RefCounts = Union[Callable[[list[int]], Sequence[int]], np.ndarray]  # noqa: UP007
"""Rule 4's ref counts: ``f(dst_ids) -> one count per id``, or ``counts[block_id]``."""

_INT64 = np.dtype(np.int64)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NO_IDS = np.zeros(0, np.int64)
_THREE_FIELDS = {BlockCopy}  # rows of exactly three items by construction (a NamedTuple)


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{what} must be an int, got {value!r}")
    value = int(value)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise InvalidArgument(f"{what} must fit in int64, got {value!r}")
    return value


def as_pair_array(pairs: Iterable[Sequence[int]] | np.ndarray) -> np.ndarray:
    """``[n, 3]`` int64 ``(src, dst, group)`` rows; :class:`InvalidArgument` otherwise.

    An integer ``[n, 3]`` array passes as it is (int64, C order: no copy). A list of plain
    int triples (what the manager hands over) takes C-level scans (lengths, exact ``int``
    types: a ``bool`` or ``float`` is refused) and one packing into the array;
    anything else is checked element by element, for a message naming the bad entry.
    """
    if isinstance(pairs, np.ndarray):
        if pairs.dtype.kind in "iu" and pairs.ndim == 2 and pairs.shape[1] == 3:
            if pairs.dtype.kind == "u" and pairs.size and int(pairs.max()) > _INT64_MAX:
                raise InvalidArgument("pairs: ids must fit in int64")
            return np.ascontiguousarray(pairs, dtype=_INT64)
        pairs = pairs.tolist()  # the element-wise path names what is wrong
    rows = pairs if isinstance(pairs, list) else list(pairs)
    try:  # C-level scans: every entry has three items, every item is exactly an int
        flat = list(chain.from_iterable(rows))
        plain = len(flat) == 3 * len(rows) and \
            (set(map(type, rows)) <= _THREE_FIELDS or set(map(len, rows)) <= {3}) and \
            set(map(type, flat)) <= {int}
    except TypeError:  # an entry that is not a sequence: the slow path names it
        plain = False
    if plain:
        out = np.empty((len(rows), 3), dtype=_INT64)
        try:  # struct writes the ints straight into the array: ~3x np.array(flat)
            # (numpy's stubs do not declare an ndarray a writable buffer on Python 3.11)
            struct.pack_into(f"{len(flat)}q", out, 0, *flat)  # type: ignore[arg-type]
            return out
        except struct.error:  # an int beyond int64: the slow path names it
            pass
    parsed: list[tuple[int, int, int]] = []
    for i, pair in enumerate(rows):
        try:
            src, dst, group = pair
        except (TypeError, ValueError):
            raise InvalidArgument(
                f"pairs[{i}] must be (src_block_id, dst_block_id, group_id), got {pair!r}"
            ) from None
        parsed.append((_int(src, f"pairs[{i}].src"), _int(dst, f"pairs[{i}].dst"),
                       _int(group, f"pairs[{i}].group")))
    return np.array(parsed, dtype=_INT64).reshape(-1, 3)


@dataclass(frozen=True)
class SegmentMap:
    """Where each group's blocks lie in two flat buffers: per layer and K/V the word offset
    of block 0 on each side (group ``g``'s in ``[start[g], start[g + 1])``), and the words
    per block. A group without KV tensors (Mamba) has no bases: its runs move nothing."""

    src_bases: np.ndarray
    dst_bases: np.ndarray
    start: np.ndarray
    words: np.ndarray

    @classmethod
    def between(cls, src: Any, dst: Any) -> SegmentMap:
        """For two :class:`~kvpool.gpu.kv_cache.PagedKVCache` of the same groups."""
        if src.num_groups != dst.num_groups or src.word_bytes != dst.word_bytes:
            raise InvalidArgument("the two caches must have the same groups and word size")
        src_bases: list[int] = []
        dst_bases: list[int] = []
        start, words = [0], []
        for g in range(src.num_groups):
            sb, w = src.block_word_spans(g)
            db, dw = dst.block_word_spans(g)
            if len(sb) != len(db) or (sb and w != dw):
                raise InvalidArgument(f"group {g} has other layers or block shapes in the "
                                      "two caches")
            src_bases += sb
            dst_bases += db
            start.append(len(src_bases))
            words.append(w)
        return cls(np.array(src_bases, _INT64), np.array(dst_bases, _INT64),
                   np.array(start, _INT64), np.array(words, _INT64))


@dataclass(frozen=True)
class CopyPlan:
    """A checked batch: its rows, the number of runs after merging, and the segments
    ``[k, 3]`` of ``(src_word, dst_word, num_words)`` for one kernel launch."""

    pairs: np.ndarray
    runs: int
    segments: np.ndarray

    @property
    def words(self) -> int:
        return int(self.segments[:, 2].sum()) if len(self.segments) else 0


class CopyPlanner:
    """Plans batches from ``src``'s blocks onto ``dst``'s (two
    :class:`~kvpool.gpu.kv_cache.PagedKVCache`, or one twice for a device copy).

    ``same_space``: sources and destinations are ids of one pool (a device copy); a swap's
    other side is a separate id space, so rule 3's "also a source" does not apply to it.
    ``null_dst``: the destination side has a null block 0 (a host buffer has none); a source
    side has one when it is the pool's (``same_space``, or a swap onto the host).

    Not thread-safe: it keeps one scratch array (one entry per destination id, zero between
    batches) so that a batch costs O(n), not O(pool).
    """

    def __init__(self, src: Any, dst: Any, *, same_space: bool, null_dst: bool = True,
                 radix_bits: int = ck.RADIX_BITS) -> None:
        self.map = SegmentMap.between(src, dst)
        self.num_groups = src.num_groups
        self.src_blocks = src.num_blocks
        self.dst_blocks = dst.num_blocks
        self.same_space = same_space
        self.null_dst = null_dst
        self.radix_bits = radix_bits
        self._marks = np.zeros(self.dst_blocks, _INT64)
        self._info = np.zeros(4, _INT64)

    def plan(self, pairs: Iterable[Sequence[int]] | np.ndarray, *,
             ref_cnts: RefCounts | None = None,
             retained: Sequence[int] | np.ndarray = ()) -> CopyPlan:
        """Check ``pairs`` against every rule (raising the first failure's typed error;
        nothing is planned then) and plan it."""
        arr = as_pair_array(pairs)
        held = _id_array(retained)
        if ref_cnts is None:
            return self._run(arr, ck.NO_REFS, _NO_IDS, held)
        if isinstance(ref_cnts, np.ndarray):
            if ref_cnts.ndim != 1 or ref_cnts.dtype.kind not in "iu":
                raise InvalidArgument("ref_cnts as an array must be 1-D integers, one per "
                                      "block id")
            if len(ref_cnts) < self.dst_blocks:
                raise InvalidArgument(f"ref_cnts holds {len(ref_cnts)} counts for "
                                      f"{self.dst_blocks} blocks")
            refs = np.ascontiguousarray(ref_cnts, dtype=_INT64)
            return self._run(arr, ck.REFS_BY_BLOCK, refs, held)
        if not len(arr):
            return self._run(arr, ck.NO_REFS, _NO_IDS, held)
        self._run(arr, ck.IDS_ONLY, _NO_IDS, held)  # rules 1-3 before asking about the ids
        counts = ref_cnts(arr[:, 1].tolist())
        try:
            refs = np.asarray(counts, dtype=_INT64)
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgument(f"ref_cnts returned {counts!r}, not integers") from None
        if refs.shape != (len(arr),):
            raise InvalidArgument(f"ref_cnts returned {refs.size} counts for {len(arr)} "
                                  "destinations")
        return self._run(arr, ck.REFS_BY_PAIR, refs, held)

    def _run(self, arr: np.ndarray, mode: int, refs: np.ndarray, held: np.ndarray) -> CopyPlan:
        m, info = self.map, self._info
        seg = ck.plan_copies(arr, self.num_groups, self.src_blocks, self.dst_blocks,
                             self.same_space, self.null_dst, mode, refs, held, self._marks,
                             m.src_bases, m.dst_bases, m.start, m.words, self.radix_bits, info)
        if info[0] != ck.OK:
            self._raise(arr, info)
        return CopyPlan(arr, int(info[1]), seg)

    def _raise(self, arr: np.ndarray, info: np.ndarray) -> None:
        code, i, a, b = (int(x) for x in info)
        if code == ck.BAD_PLAN_INPUT:  # the planner's own arrays: a bug here, not the batch's
            raise RuntimeError(f"copy planner refused its own inputs {info.tolist()}")
        s, d, g = arr[i].tolist()
        if code == ck.BAD_GROUP:
            raise InvalidGroupId(f"pairs[{i}]: group {g} is not in [0, {self.num_groups})")
        if code == ck.BAD_SOURCE:
            raise InvalidBlockId(f"pairs[{i}]: source block {s} is not in "
                                 f"[0, {self.src_blocks})")
        if code == ck.BAD_DESTINATION:
            raise InvalidBlockId(f"pairs[{i}]: destination block {d} is not in "
                                 f"[0, {self.dst_blocks})")
        if code == ck.NULL_PAIR:
            raise InvalidCopyPair(f"pairs[{i}] names the null block: ({s} -> {d})")
        if code == ck.DESTINATION_TWICE:
            raise InvalidCopyPair(f"pairs[{i}]: destination block {d} is already the "
                                  f"destination of pairs[{a}]")
        if code == ck.DESTINATION_IS_SOURCE:
            raise InvalidCopyPair(f"pairs[{i}]: destination block {d} is also a source of "
                                  "this batch")
        if code == ck.DESTINATION_SHARED:
            raise InvalidCopyPair(
                f"pairs[{i}]: destination block {d} is still shared ({a} holders, {b} of "
                "them this batch's retentions): writing it would change what another "
                "holder reads")
        raise RuntimeError(f"copy planner: unknown outcome {info.tolist()}")


def _id_array(ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Block ids as int64 (values beyond int64 name no block and are dropped)."""
    if isinstance(ids, np.ndarray) and ids.dtype == _INT64 and ids.ndim == 1:
        return np.ascontiguousarray(ids)
    kept = [int(b) for b in ids]
    return np.array([b for b in kept if _INT64_MIN <= b <= _INT64_MAX], dtype=_INT64)


def coalesce(pairs: np.ndarray) -> np.ndarray:
    """Runs ``[m, 4]`` of ``(group, src_start, dst_start, length)``: pairs sorted by group
    and source, merged while both ids advance by one (the planner's own step; ids must be
    non-negative)."""
    arr = as_pair_array(pairs)
    if not len(arr):
        return np.zeros((0, 4), _INT64)
    if int(arr.min()) < 0:
        raise InvalidArgument("coalesce: ids must be non-negative")
    bound = int(arr[:, 0].max()) + 1
    if (int(arr[:, 2].max()) + 1) * bound > 2**62:
        raise InvalidArgument("coalesce: ids too large to order")
    return ck.coalesce_runs(arr, bound, ck.RADIX_BITS)


def segments(runs: np.ndarray, src_cache: Any, dst_cache: Any) -> np.ndarray:
    """``[k, 3]`` int64 ``(src_word, dst_word, num_words)``: one per run, layer and K/V
    (the planner's own step)."""
    m = SegmentMap.between(src_cache, dst_cache)
    runs = np.ascontiguousarray(runs, dtype=_INT64).reshape(-1, 4)
    if len(runs) and not (0 <= int(runs[:, 0].min()) and
                          int(runs[:, 0].max()) < src_cache.num_groups):
        raise InvalidGroupId("segments: a run's group is not a group of the caches")
    return ck.run_segments(runs, m.src_bases, m.dst_bases, m.start, m.words)


__all__ = ["CopyPlan", "CopyPlanner", "RefCounts", "SegmentMap", "as_pair_array", "coalesce",
           "segments"]
