"""Structural self-check of a fast pool's arrays, one named claim each (a testing aid).

Contract: :func:`violations` returns ``[(claim, witnesses)]`` for every claim the arrays of a
:class:`~kvpool.fast.state.FastState` break, empty when the structure is sound. These are
claims about the *representation* (links mutual, counters equal to recounts, the table
holding exactly the live keys); claims about the pool's behaviour are the spec's invariants,
checked on ``abstract()``. Runs the plain helpers of :mod:`kvpool.fast.kernels`: O(N + keys).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvpool.fast import kernels as k
from kvpool.fast.state import FastState


def queue_links_are_mutual(st: FastState) -> tuple:
    """Walking ``NEXT`` from the head reaches the tail through mutual links, visiting exactly
    ``M_NUM_FREE`` distinct non-null blocks, each with ref_cnt 0."""
    n = st.num_blocks
    blk = st.blk
    prev, next_, _ = k._decoded_links(blk)
    head, tail = n, n + 1
    seen: set[int] = set()
    b = head
    bad: list[object] = []
    for _ in range(n + 1):
        nxt = int(next_[b])
        if not 0 <= nxt < n + 2 or int(prev[nxt]) != b:
            return ("broken link", b)
        if nxt == tail:
            break
        if nxt == 0 or nxt in seen or blk[nxt, k.REF] != 0:
            bad.append(nxt)
        seen.add(nxt)
        b = nxt
    else:
        return ("no tail",)
    if len(seen) != st.num_free():
        bad.append(("count", len(seen), st.num_free()))
    return tuple(bad)


def unqueued_blocks_have_cleared_links(st: FastState) -> tuple:
    """A block is queued ⇔ ref_cnt 0 and not null; unqueued blocks have both links -1."""
    n = st.num_blocks
    ref = st.blk[:n, k.REF]
    prev, next_, _ = (column[:n] for column in k._decoded_links(st.blk))
    linked = prev != -1
    should = ref == 0
    should[0] = False
    both_clear = (prev == -1) & (next_ == -1)
    return tuple(np.nonzero((linked != should) | (~linked & ~both_clear) | (ref < 0))[0].tolist())


def scratch_marks_are_clear(st: FastState) -> tuple:
    """The MARK scratch column is 0 between calls."""
    return tuple(np.nonzero(st.blk[:, k.MARK])[0].tolist())


def entries_are_accounted(st: FastState) -> tuple:
    """Live entry rows = ``M_ENT_USED``; the free list holds exactly the other used rows."""
    high = int(st.meta[k.M_ENT_HIGH])
    live = int(np.count_nonzero(st.ent[:high, k.E_BLOCK] >= 0))
    free, e = 0, int(st.meta[k.M_ENT_FREE])
    while e != -1 and free <= high:
        if st.ent[e, k.E_BLOCK] != -1:
            return ("live row on free list", e)
        free += 1
        e = int(st.ent[e, k.E_BNEXT])
    if live != int(st.meta[k.M_ENT_USED]) or live + free != high:
        return (live, free, high, int(st.meta[k.M_ENT_USED]))
    return ()


def block_chains_are_consistent(st: FastState) -> tuple:
    """Each block's chain holds its own entries, distinct keys, and a primary token count
    (>= 1 hbs unit) exactly when it has a key."""
    bad: list[object] = []
    total = 0
    first = k._decoded_links(st.blk)[2]
    for b in range(st.num_blocks):
        e = int(first[b])
        units = int(st.blk64[b, k.TOKENS])
        if (e == -1) != (units == 0) or units < 0:
            bad.append(b)
        kids = []
        while e != -1:
            if st.ent[e, k.E_BLOCK] != b:
                bad.append(b)
                break
            kids.append(int(st.ent[e, k.E_KEY]))
            e = int(st.ent[e, k.E_BNEXT])
        total += len(kids)
        if len(set(kids)) != len(kids) or (b == 0 and kids):
            bad.append(b)
    if total != int(st.meta[k.M_ENT_USED]):
        bad.append(("entries on chains", total))
    return tuple(bad)


def key_rows_are_consistent(st: FastState) -> tuple:
    """Live key rows have non-empty mutual chains of their own entries, the block of their
    head entry and a hash equal to the hash of their bytes; no row is pending between calls;
    counters match."""
    high = int(st.meta[k.M_KEY_HIGH])
    bad: list[object] = []
    live, total = 0, 0
    for kid in range(high):
        head = int(st.keys[kid, k.K_HEAD])
        if head == k.KEY_PENDING_ROW or head < k.KEY_PENDING_ROW:
            bad.append(kid)
        if head < 0:
            continue
        live += 1
        prev, e = -1, head
        while e != -1:
            if st.ent[e, k.E_KEY] != kid or st.ent[e, k.E_KPREV] != prev:
                bad.append(kid)
                break
            prev, e = e, int(st.ent[e, k.E_KNEXT])
            total += 1
        if st.keys[kid, k.K_TAIL] != prev or st.keys[kid, k.K_BLOCK] != st.ent[head, k.E_BLOCK]:
            bad.append(kid)
        length = int(st.keys[kid, k.K_LEN])
        row = st.key_bytes[kid]
        group = int.from_bytes(row[length - 4 : length].tobytes(), "big")
        if k._hash_key(row, 0, length - 4, group) != st.keys[kid, k.K_HASH]:
            bad.append(kid)
    free, kid = 0, int(st.meta[k.M_KEY_FREE])
    while kid != -1 and free <= high:
        free += 1
        kid = int(st.keys[kid, k.K_TAIL])
    if live != int(st.meta[k.M_KEY_USED]) or live + free != high:
        bad.append(("counts", live, free, high))
    if total != int(st.meta[k.M_ENT_USED]):
        bad.append(("entries on key chains", total))
    return tuple(bad)


def table_holds_exactly_live_keys(st: FastState) -> tuple:
    """Every live key is found by probing from its hash; the table holds nothing else and is
    at most half full."""
    table = st.table
    entries = table[table != -1]
    occupied = (entries & k.ROW_MASK).tolist()
    bad: list[object] = [kid for kid in occupied if st.keys[kid, k.K_HEAD] < 0]
    tags = (entries >> 32).tolist()
    bad += [("fingerprint", kid) for kid, tag in zip(occupied, tags, strict=True)
            if tag != int(st.keys[kid, k.K_HASH]) & k.TAG_MASK]
    for kid in range(int(st.meta[k.M_KEY_HIGH])):
        if st.keys[kid, k.K_HEAD] < 0:
            continue
        length = int(st.keys[kid, k.K_LEN])
        row = st.key_bytes[kid]
        group = int.from_bytes(row[length - 4 : length].tobytes(), "big")
        found = k._find_key(st.keys, st.key_bytes, table, row, 0, length - 4, group,
                            int(st.keys[kid, k.K_HASH]))
        if found != kid:
            bad.append(kid)
    if len(set(occupied)) != len(occupied) or 2 * len(occupied) > table.shape[0]:
        bad.append(("occupancy", len(occupied)))
    return tuple(bad)


def watchers_are_counted(st: FastState) -> tuple:
    """``M_NUM_WATCHERS`` counts the blocks with a stamp; stamps are distinct, not beyond the
    clock; the null block and the sentinels are never watched."""
    stamps = st.blk64[:, k.WATCH]
    watched = stamps[stamps != 0]
    bad: list[object] = []
    if watched.size != st.num_watchers() or stamps[0] or stamps[st.num_blocks:].any():
        bad.append(("count", int(watched.size)))
    if len(set(watched.tolist())) != watched.size or (watched > st.meta[k.M_WATCH_CLOCK]).any():
        bad.append("stamps")
    return tuple(bad)


def no_records_left_over(st: FastState) -> tuple:
    """Every call's event records were decoded and released (``M_EV_LEN`` = 0)."""
    return (int(st.meta[k.M_EV_LEN]),) if st.meta[k.M_EV_LEN] else ()


CLAIMS: tuple[Callable[[FastState], tuple], ...] = (
    queue_links_are_mutual,
    unqueued_blocks_have_cleared_links,
    scratch_marks_are_clear,
    entries_are_accounted,
    block_chains_are_consistent,
    key_rows_are_consistent,
    table_holds_exactly_live_keys,
    watchers_are_counted,
    no_records_left_over,
)


def violations(st: FastState) -> list[tuple[str, tuple]]:
    """``[(claim name, witnesses)]`` for every broken claim, in :data:`CLAIMS` order."""
    return [(claim.__name__, w) for claim in CLAIMS if (w := claim(st))]
