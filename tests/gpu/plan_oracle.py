"""The copy planner as it was before it became one jitted pass: plain numpy, rule by rule.

Kept only as the test oracle of :mod:`kvpool.gpu.copy_plan` (tests/gpu/test_copy_plan.py
compares the two on random batches, valid or not): slow, vectorised the obvious way, and
easy to read against the rules of copy_plan's docstring.
"""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import chain

import numpy as np

from kvpool.errors import InvalidArgument, InvalidBlockId, InvalidGroupId
from kvpool.gpu.errors import InvalidCopyPair

RefCounts = Callable[[list[int]], list[int]]


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{what} must be an int, got {value!r}")
    return int(value)


def as_pair_array(pairs: Iterable[Sequence[int]]) -> np.ndarray:
    """``[n, 3]`` int64 ``(src, dst, group)`` rows; :class:`InvalidArgument` otherwise.

    Fast path: a list of int triples (what the manager hands over) or an integer array;
    anything else is checked element by element, for a message naming the bad entry.
    """
    if isinstance(pairs, np.ndarray) and pairs.dtype.kind in "iu" and pairs.ndim == 2 and \
            pairs.shape[1] == 3:
        return np.ascontiguousarray(pairs, dtype=np.int64)
    rows = list(pairs)
    try:  # C-level scans: every entry has three items, every item is exactly an int
        flat = list(chain.from_iterable(rows))
        plain = set(map(len, rows)) <= {3} and set(map(type, flat)) <= {int}
    except TypeError:  # an entry that is not a sequence: the slow path names it
        plain = False
    if plain:
        return np.array(flat, dtype=np.int64).reshape(-1, 3)
    out = []
    for i, pair in enumerate(rows):
        try:
            src, dst, group = pair
        except (TypeError, ValueError):
            raise InvalidArgument(
                f"pairs[{i}] must be (src_block_id, dst_block_id, group_id), got {pair!r}"
            ) from None
        out.append((_int(src, f"pairs[{i}].src"), _int(dst, f"pairs[{i}].dst"),
                    _int(group, f"pairs[{i}].group")))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def check_batch(pairs: np.ndarray, num_groups: int, src_blocks: int, dst_blocks: int, *,
                same_space: bool, ref_cnts: RefCounts | None = None,
                retained: Sequence[int] = (), null_dst: bool = True) -> None:
    """Every rule of the module docstring, in that order; raises before anything moves.
    Vectorised: O(n log n) in numpy, whatever the batch size.

    ``same_space``: sources and destinations are ids of one pool (a device copy); a swap's
    other side is a separate id space, so rule 3's "also a source" does not apply to it.
    ``null_dst``: the destination side has a null block 0 (a host buffer has none).
    """
    if not len(pairs):
        return
    src, dst, group = pairs[:, 0], pairs[:, 1], pairs[:, 2]
    bad = _first((group < 0) | (group >= num_groups) | (src < 0) | (src >= src_blocks) |
                 (dst < 0) | (dst >= dst_blocks))
    if bad is not None:
        s, d, g = pairs[bad].tolist()
        if not 0 <= g < num_groups:
            raise InvalidGroupId(f"pairs[{bad}]: group {g} is not in [0, {num_groups})")
        if not 0 <= s < src_blocks:
            raise InvalidBlockId(f"pairs[{bad}]: source block {s} is not in [0, {src_blocks})")
        raise InvalidBlockId(f"pairs[{bad}]: destination block {d} is not in [0, {dst_blocks})")
    src_null = same_space or not null_dst
    bad = _first(((src == 0) & src_null) | ((dst == 0) & null_dst))
    if bad is not None:
        s, d, _ = pairs[bad].tolist()
        raise InvalidCopyPair(f"pairs[{bad}] names the null block: ({s} -> {d})")
    order = np.argsort(dst, kind="stable")
    repeated = np.flatnonzero(dst[order][1:] == dst[order][:-1])
    if len(repeated):
        later = order[repeated + 1]
        i = int(later.min())
        first = int(order[np.searchsorted(dst[order], dst[i])])
        raise InvalidCopyPair(f"pairs[{i}]: destination block {int(dst[i])} is already the "
                              f"destination of pairs[{first}]")
    if same_space:
        bad = _first(np.isin(dst, src))
        if bad is not None:
            raise InvalidCopyPair(
                f"pairs[{bad}]: destination block {int(dst[bad])} is also a source of this "
                "batch")
    if ref_cnts is not None:
        dsts = dst.tolist()
        held = Counter(int(b) for b in retained)
        for i, (d, ref) in enumerate(zip(dsts, ref_cnts(dsts), strict=True)):
            if ref - held[d] > 1:
                raise InvalidCopyPair(
                    f"pairs[{i}]: destination block {d} is still shared ({ref} holders, "
                    f"{held[d]} of them this batch's retentions): writing it would change "
                    "what another holder reads")


def coalesce(pairs: np.ndarray) -> np.ndarray:
    """Runs ``[m, 4]`` of ``(group, src_start, dst_start, length)``: pairs sorted by group
    and source, merged while both ids advance by one."""
    if not len(pairs):
        return np.zeros((0, 4), dtype=np.int64)
    order = np.lexsort((pairs[:, 0], pairs[:, 2]))
    p = pairs[order]
    src, dst, group = p[:, 0], p[:, 1], p[:, 2]
    breaks = np.ones(len(p), dtype=bool)
    breaks[1:] = (group[1:] != group[:-1]) | (src[1:] != src[:-1] + 1) | \
        (dst[1:] != dst[:-1] + 1)
    starts = np.flatnonzero(breaks)
    lengths = np.diff(np.append(starts, len(p)))
    return np.stack([group[starts], src[starts], dst[starts], lengths], axis=1)


def segments(runs: np.ndarray, src_cache, dst_cache) -> np.ndarray:
    """``[k, 3]`` int64 ``(src_word, dst_word, num_words)``: one per run, layer and K/V."""
    out = []
    for g in np.unique(runs[:, 0]).tolist() if len(runs) else []:
        src_bases, words = src_cache.block_word_spans(g)
        dst_bases, dst_words = dst_cache.block_word_spans(g)
        if not src_bases:
            continue  # a group without KV tensors here (Mamba state): nothing to move
        assert words == dst_words
        r = runs[runs[:, 0] == g]
        sb = np.asarray(src_bases, dtype=np.int64)[None, :]
        db = np.asarray(dst_bases, dtype=np.int64)[None, :]
        s = sb + r[:, 1:2] * words
        d = db + r[:, 2:3] * words
        n = np.broadcast_to(r[:, 3:4] * words, s.shape)
        out.append(np.stack([s.ravel(), d.ravel(), n.ravel()], axis=1))
    if not out:
        return np.zeros((0, 3), dtype=np.int64)
    return np.ascontiguousarray(np.concatenate(out), dtype=np.int64)
