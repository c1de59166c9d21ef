"""Array kernels of the fast pool: plain Python functions over numpy arrays and ints.

Contract: every kernel validates its whole input before it writes anything, returns an error
code (``OK`` = 0) instead of raising, and never indexes outside its arrays for any caller
input (every caller id is range-checked first). The same source runs uncompiled (tests,
``NUMBA_DISABLE_JIT=1``) and compiled by :mod:`kvpool.fast.compiled`; kernels read no
configuration globals (settings are arguments) and only use what Numba and Python evaluate
identically — ints from arrays go through ``int()`` before any arithmetic that could widen.

Every kernel first rebinds its array arguments with :func:`_raw` (compiled: views Numba does
not reference-count; its docstring says why). The one-op hot paths (``h_*``, at the end) and
the batch kernels over the hash index take the pool's arrays in one :class:`PoolArrays`
object ``s`` instead of one argument each.

What the hot loops cost and why they are written so (``benchmarks/bench_kernels.py``: the kit
trace's batch-verb kernels replayed alone; ~700k prefix-cache and queue operations). Once
the reference counting was gone, most of an operation's time was instructions, not cache
misses: on a pool that fits L2 an evicting pop cost about as much as on the 20k-block pool.
So, measured in turn: the borrowed views carry no reference count at all (no opaque call
around any helper call: ~84 → ~65 ns per operation); the per-block and per-key helpers are
inlined into ``_pop_front`` and ``_cache_candidates`` (``compiled._INLINED``: ~65 → ~56);
keys are compared, copied and hashed a word at a time (:func:`_word`, :func:`_word_be`,
:func:`_put_word`: ~56 → ~40). ``_pop_front`` walks the queue first and evicts second,
prefetching the next blocks' entry rows, key rows and table slots (:func:`_prefetch`): the
chains of different blocks overlap (admissions ~10% faster than without, A/B on the same
calls). Prefetching the table slots of the next keys in insertions and in the admission
scan measured no faster (tried, dropped).

Everything compiled lives in this one file on purpose: Numba's on-disk cache (``cache=True``)
only watches the source file of the function it compiled, so a helper or a constant kept in
another module could change without invalidating the cached machine code that inlined it.

Data layout (``N`` = number of blocks; rows ``N`` and ``N+1`` of ``blk`` are the free queue's
head and tail sentinels):

``blk`` int32 [N+2, 5]
    ``PREV``/``NEXT`` queue links (-1 = not queued), ``REF`` ref_cnt, ``FIRST`` the block's
    first key entry (its primary; -1 = no key), ``MARK`` scratch (0 between calls). Links
    and first entries are stored *relative to the row*: ``NEXT`` holds ``next - b - 1``,
    ``PREV`` holds ``prev - b + 1``, ``FIRST`` holds ``first + 1`` (helpers ``_next``,
    ``_prev``, ``_first`` and their setters). So an all-zero row means "between blocks
    ``b - 1`` and ``b + 1`` in the queue, ref 0, no key" — exactly a fresh pool's block:
    the array is allocated zeroed (the OS hands out zero pages on first touch) and
    :func:`init_state` writes five rows, whatever ``N``. Why: writing 20 bytes per block at
    construction (and the page faults it triggers) was the whole cost of building a pool.
``blk64`` int64 [N+2, 2]
    ``TOKENS`` primary token count in units of ``hash_block_size`` (bounded by the request's
    hash list, so it cannot overflow however large the sizes), ``WATCH`` watcher-table stamp
    (0 = no watcher; larger = registered later).
``ent`` int32 [E, 5] — one row per (key, block) pair
    ``E_KEY`` key id, ``E_BLOCK`` block id (-1 = free row), ``E_KPREV``/``E_KNEXT`` the key's
    chain (insertion order: the head is the earliest surviving block, what a lookup returns),
    ``E_BNEXT`` the block's chain (primary first, then secondaries in insertion order; also
    the free-row list).
``keys`` int64 [K, 8] + ``key_bytes`` uint8 [K, stride] — one row per distinct key
    ``K_HASH`` 63-bit hash of the packed key, ``K_LEN`` its length, ``K_HEAD``/``K_TAIL`` its
    entry chain, ``K_BLOCK`` the block of its head entry (what a lookup returns, kept in the
    row so that a hit reads no entry row), ``K_GEN`` how many keys the row has held (a row
    id plus its generation names one key for as long as that key lives). ``K_HEAD`` = -1
    marks a free row (``K_TAIL`` then links the free list), -2 a row removed during this call
    whose bytes an event still needs (released after decoding).
    ``key_bytes[k, :K_LEN]`` = hash bytes ‖ group id (4 bytes big-endian), i.e. the packed key.
``table`` int64 [T] (T a power of two, at most 2**31)
    open addressing, linear probing; an entry is ``fingerprint << 32 | key id`` (-1 = empty),
    the fingerprint being the key hash's 31 low bits, which also give its home slot. A probe
    compares fingerprints in the table and reads a key row only on a match (a miss or a
    collision costs no other cache line), and deletion shifts later entries back (no
    tombstones) from their fingerprints alone. The caller keeps the load at most 1/2, so the
    table of a pool of 20k cached blocks is 512 KiB.
``meta`` int64 [META_SIZE]
    counters (``M_*``). ``events`` int64 [R, 3]: (kind, payload, seq) records of this call.

Capacity (rows of ``ent``/``keys``/``events``, ``stride``, table size) is grown by the state
object before a call; kernels re-check it and refuse (``ERR_CAPACITY``) rather than overflow.

Why this key storage: a block costs 36 bytes here whether or not it is ever cached, and key
memory is paid per *distinct key* and per *(key, block) pair*, only as they appear (rows
double on demand). A key is stored once however many blocks carry it (duplicates cost one
20-byte entry row each), in a fixed-stride row so that a freed row is reused as is; the stride
is the longest key seen rounded up to a power of two (64 for SHA-256 keys of 36 bytes, 32 for
xxh3-128's 20), grown if a longer one comes. Every array starts on a 64-byte boundary and a
``keys`` row is padded from 6 to 8 words, so a key's header and (up to 64) bytes are one cache
line each: a prefix hit reads three lines (table slot, header, bytes), never a row split
across two (measured: cold lookups about a quarter faster than with 48- and 36-byte rows).
A fully cached pool with distinct 36-byte keys adds about 20 + 64 + 64 + 16 (table at load
<= 1/2) = 164 bytes per block, up to twice that right after a doubling. Limits: ids and
ref counts are int32 (N < 2**31 - 2; 2**31 - 1 holders per block).
"""

from __future__ import annotations

import numpy as np

# -- column and slot indices --------------------------------------------------------------------
PREV, NEXT, REF, FIRST, MARK = 0, 1, 2, 3, 4
BLK_COLS = 5
TOKENS, WATCH = 0, 1
BLK64_COLS = 2
E_KEY, E_BLOCK, E_KPREV, E_KNEXT, E_BNEXT = 0, 1, 2, 3, 4
ENT_COLS = 5
K_HASH, K_LEN, K_HEAD, K_TAIL, K_BLOCK, K_GEN = 0, 1, 2, 3, 4, 5
KEY_COLS = 8  # six used, two of padding: a row is one 64-byte cache line
KEY_FREE_ROW, KEY_PENDING_ROW = -1, -2
EV_KIND, EV_PAYLOAD, EV_SEQ = 0, 1, 2
EV_COLS = 3

M_NUM_FREE = 0  # blocks in the free queue
M_EVENT_COUNT = 1  # sequence number of the next event
M_EV_LEN = 2  # records written by the last call
M_NUM_WATCHERS = 3
M_WATCH_CLOCK = 4  # last watcher stamp handed out
M_ENT_USED = 5  # live entry rows
M_ENT_FREE = 6  # head of the free entry-row list
M_ENT_HIGH = 7  # rows ever used (rows >= this were never touched)
M_KEY_USED = 8  # key rows not on the free list (live + pending)
M_KEY_FREE = 9
M_KEY_HIGH = 10
M_ERR_INDEX = 11  # position of the offending argument when a kernel refuses
M_RESULT = 12  # a scalar result (hit count, reset outcome)
M_FIRED_LEN = 13  # watchers fired by the last call
META_SIZE = 14

# -- return codes -------------------------------------------------------------------------------
OK = 0
ERR_BLOCK_ID = 1  # id out of range; M_ERR_INDEX = its position
ERR_NO_FREE = 2
ERR_DOUBLE_FREE = 3  # M_ERR_INDEX = first position whose block is over-released
ERR_NULL_BLOCK = 4
ERR_DUPLICATE = 5  # a block listed twice among the blocks to cache
ERR_FREE_BLOCK = 6  # a cache write on a block with ref_cnt 0
ERR_KEYED = 7  # a block already carries an equal or longer key
ERR_DST_KEYED = 8
ERR_ARGUMENT = 9  # negative count or malformed shapes (the shell checks these first)
ERR_CAPACITY = 10  # the state did not grow an array first: a bug, never user input
NEED_FULL = 11  # a lean kernel declines (changing nothing): use the full one
REFUSED = 12  # admit_request: the admission test failed (not an error; nothing changed)
ERR_REF_OVERFLOW = 13  # touch past MAX_REF_CNT; M_ERR_INDEX = first position that overflows

MAX_REF_CNT = 2**31 - 1  # int32 ref counts; equals kvpool.spec.state.MAX_REF_CNT (tested)

EV_REMOVED, EV_STORED, EV_PARTIAL, EV_CLEARED = 1, 2, 3, 4

# Key hashing constants (FNV's); every step is masked to 63 bits so that the plain-Python run
# (unbounded ints, masked) and the compiled run (wrapping int64, masked) agree exactly.
FNV_OFFSET = 0x4BF29CE484222325
FNV_PRIME = 0x100000001B3
MASK63 = 0x7FFFFFFFFFFFFFFF
TAG_MASK = 0x7FFFFFFF  # table entry: fingerprint (hash bits 0-30) << 32 | key row id
ROW_MASK = 0xFFFFFFFF


# ===============================================================================================
# Construction
# ===============================================================================================


def init_state(blk, meta):
    """A fresh pool: every block free in id order, block 0 (null) out of the queue.

    blk int32 [N+2, BLK_COLS] **all zero** (as allocated: see the encoding in the module
    docstring, where a zero row is "linked between its id neighbours, ref 0, no key"), meta
    int64 [META_SIZE]; N >= 1. Only the rows whose links differ from their neighbours' ids
    are written — block 0, block 1, block N-1 and the two sentinels — so a pool of any size
    is built without touching its block rows (``blk64`` likewise starts zero).
    """
    blk, meta = _raw(blk), _raw(meta)
    n = blk.shape[0] - 2
    head = n
    tail = n + 1
    _set_prev(blk, 0, -1)
    _set_next(blk, 0, -1)
    _set_prev(blk, head, -1)
    _set_next(blk, tail, -1)
    if n > 1:
        _set_prev(blk, 1, head)
        _set_next(blk, head, 1)
        _set_next(blk, n - 1, tail)
        _set_prev(blk, tail, n - 1)
    else:
        _set_next(blk, head, tail)
        _set_prev(blk, tail, head)
    for i in range(meta.shape[0]):
        meta[i] = 0
    meta[M_NUM_FREE] = n - 1
    meta[M_ENT_FREE] = -1
    meta[M_KEY_FREE] = -1
    return OK


def _raw(a):
    """``a`` itself (plain run); compiled, a view of it that Numba does not reference-count.

    Numba counts references to every array a helper receives, and where its pruning pass
    cannot pair the counts up (a helper with three arrays and a branch suffices) each helper
    call costs two atomic operations per array: 30-40 ns a call, measured, more than the
    work of a queue or table step. Every kernel therefore first rebinds its array arguments
    to such views (:mod:`kvpool.fast.compiled` supplies the compiled version). They are
    safe for the call: the caller's arguments keep the arrays alive until it returns, and
    no kernel returns or stores an array.
    """
    return a


def _prefetch(a, i):
    """Hint that row ``i`` of ``a`` is read soon: compiled, a software prefetch of the row's
    first cache line (:mod:`kvpool.fast.compiled`); plain, nothing. Any ``i`` is safe: a
    prefetch never faults and changes nothing but timing.

    Why: the index is a web of linked rows (block → entry → key → table slot), and a chain
    of dependent loads that miss L2 costs one memory latency per link (~40 ns here). The
    chains of *different* blocks are independent, so the hot loops run a few blocks ahead
    and prefetch their next links (:data:`AHEAD`): the misses overlap instead of adding up.
    """
    return None


def _word(a, i):
    """The 8 bytes ``a[i : i + 8]`` of a uint8 array or ``bytes`` (in range: the caller
    checks) as one integer, for comparing and copying keys a word at a time. Compiled: one
    unaligned load (an int64 of the same bits); plain: the little-endian value. Only ever
    compared with another ``_word`` or stored back with :func:`_put_word` in the same run."""
    return int.from_bytes(bytes(a[i : i + 8]), "little")


def _word_be(a, i):
    """The 8 bytes ``a[i : i + 8]`` (in range) read big-endian. Compiled: an int64 of the same
    bits (negative when byte ``i`` >= 128): callers keep at most the low 56 bits."""
    return int.from_bytes(bytes(a[i : i + 8]), "big")


LOW56 = (1 << 56) - 1


def _put_word(a, i, w):
    """``a[i : i + 8]`` = the bytes of ``w`` as :func:`_word` read them (uint8 array)."""
    for j in range(8):
        a[i + j] = (w >> (8 * j)) & 255


AHEAD = 8  # how many blocks (or keys) a pipelined loop's prefetches run ahead of its work


# ===============================================================================================
# Free queue (intrusive doubly linked list over blk rows)
# ===============================================================================================


# Links and first entries are stored relative to the row (the module docstring's encoding):
# every read and write of PREV, NEXT and FIRST goes through these six helpers.


def _next(blk, b):
    """The block after ``b`` in the queue (-1: ``b`` is not queued)."""
    return int(blk[b, NEXT]) + b + 1


def _prev(blk, b):
    """The block before ``b`` in the queue (-1: ``b`` is not queued)."""
    return int(blk[b, PREV]) + b - 1


def _first(blk, b):
    """The block's first key entry, its primary (-1: no key)."""
    return int(blk[b, FIRST]) - 1


def _set_next(blk, b, q):
    blk[b, NEXT] = q - b - 1


def _set_prev(blk, b, p):
    blk[b, PREV] = p - b + 1


def _set_first(blk, b, e):
    blk[b, FIRST] = e + 1


def _decoded_links(blk):
    """``(prev, next, first)``: the three relative columns of every row as the ids they
    stand for (int64 arrays; -1 = none). For Python readers (the state, the integrity
    checks); plain numpy, never compiled."""
    rows = np.arange(blk.shape[0], dtype=np.int64)
    return (blk[:, PREV].astype(np.int64) + rows - 1, blk[:, NEXT].astype(np.int64) + rows + 1,
            blk[:, FIRST].astype(np.int64) - 1)


def _unlink(blk, b):
    """Take queued block ``b`` out of the queue and clear its links."""
    p = _prev(blk, b)
    q = _next(blk, b)
    _set_next(blk, p, q)
    _set_prev(blk, q, p)
    _set_prev(blk, b, -1)
    _set_next(blk, b, -1)


def _link_after(blk, at, b):
    """Link unqueued block ``b`` right after ``at`` (a queued block or the head sentinel)."""
    q = _next(blk, at)
    _set_prev(blk, b, at)
    _set_next(blk, b, q)
    _set_next(blk, at, b)
    _set_prev(blk, q, b)


def _append(blk, b):
    """Link unqueued block ``b`` at the tail (evicted last)."""
    tail = blk.shape[0] - 1
    _link_after(blk, _prev(blk, tail), b)


def _first_bad_id(ids, n):
    """Position of the first id outside ``[0, n)``, or -1."""
    for i in range(ids.shape[0]):
        if ids[i] < 0 or ids[i] >= n:
            return i
    return -1


def _first_over_released(blk, ids):
    """Position of the first id released more often in ``ids`` than its ref_cnt, or -1.

    Ids must be in range. The null block is ignored. Counts go through the MARK column: one
    pass counts, one pass compares and clears (a block's first position sees its full count,
    so clearing there cannot hide a later over-release of the same block).
    """
    for i in range(ids.shape[0]):
        blk[ids[i], MARK] += 1
    bad = -1
    for i in range(ids.shape[0]):
        b = ids[i]
        if bad < 0 and b != 0 and blk[b, MARK] > blk[b, REF]:
            bad = i
        blk[b, MARK] = 0
    return bad


# ===============================================================================================
# Hash index: keys, entries, open-addressing table
# ===============================================================================================


def _hash_key(buf, off, length, group):
    """63-bit hash of ``buf[off:off+length] ‖ group`` for the table.

    Block hashes are digests, whose bytes are already uniformly random, so a key of at least
    14 bytes is hashed from its first and last 7 bytes (one multiply step; the table indexes
    by the low bits, which the xor-shift reaches). Keys that are not digests and agree on
    those 14 bytes only share a probe run: slower, never wrong (the whole key is compared).
    Shorter keys go through FNV-style steps over 7-byte words.
    """
    group = int(group)  # a numpy scalar would make the uncompiled run overflow-warn
    if length >= 14:
        head = (_word_be(buf, off) >> 8) & LOW56  # bytes 0-6, big-endian
        tail = _word_be(buf, off + length - 8) & LOW56  # the last 7 bytes, big-endian
        h = ((head ^ (tail << 7) ^ (group << 1) ^ int(length)) * FNV_PRIME) & MASK63
        return h ^ (h >> 29)
    h = FNV_OFFSET ^ int(length)
    i = 0
    while i < length:
        word = 0
        for j in range(i, min(i + 7, length)):
            word = (word << 8) | int(buf[off + j])
        h = ((h ^ word) * FNV_PRIME) & MASK63
        h ^= h >> 29
        i += 7
    h = ((h ^ group) * FNV_PRIME) & MASK63
    return h ^ (h >> 31)


def _slot(h, kid):
    """A table entry: the key's 31 low hash bits (its fingerprint, and its home slot in any
    table of up to 2**31 slots) above its row id."""
    return ((h & TAG_MASK) << 32) | kid


def _key_equals(keys, key_bytes, kid, buf, off, length, group, h):
    """Whether key row ``kid`` holds ``buf[off:off+length] ‖ group``."""
    if keys[kid, K_HASH] != h or keys[kid, K_LEN] != length + 4:
        return False
    group = int(group)
    row = key_bytes[kid]
    i = 0
    while i + 8 <= length:  # a word at a time (stride >= length + 4: the row holds them)
        if _word(row, i) != _word(buf, off + i):
            return False
        i += 8
    while i < length:
        if row[i] != buf[off + i]:
            return False
        i += 1
    for j in range(4):
        if int(key_bytes[kid, length + j]) != (group >> (24 - 8 * j)) & 255:
            return False
    return True


def _find_key(keys, key_bytes, table, buf, off, length, group, h):
    """The live key row for ``buf[off:off+length] ‖ group``, or -1. Load < 1 ends the probe.

    A probe reads only the table until a fingerprint matches: a miss usually touches one
    cache line of the table and nothing else; a hit reads the key's row once."""
    mask = table.shape[0] - 1
    tag = h & TAG_MASK
    i = h & mask
    while True:
        entry = table[i]
        if entry == -1:
            return -1
        if (entry >> 32) == tag:
            kid = entry & ROW_MASK
            if _key_equals(keys, key_bytes, kid, buf, off, length, group, h):
                return kid
        i = (i + 1) & mask


def _new_key(keys, key_bytes, table, meta, buf, off, length, group, h):
    """Store a key that is not in the table; returns its row. Capacity checked by the caller."""
    group = int(group)
    kid = meta[M_KEY_FREE]
    if kid != -1:
        meta[M_KEY_FREE] = keys[kid, K_TAIL]
    else:
        kid = meta[M_KEY_HIGH]
        meta[M_KEY_HIGH] = kid + 1
    meta[M_KEY_USED] += 1
    keys[kid, K_GEN] += 1
    keys[kid, K_HASH] = h
    keys[kid, K_LEN] = length + 4
    keys[kid, K_HEAD] = -1
    keys[kid, K_TAIL] = -1
    keys[kid, K_BLOCK] = -1
    row = key_bytes[kid]
    i = 0
    while i + 8 <= length:
        _put_word(row, i, _word(buf, off + i))
        i += 8
    while i < length:
        row[i] = buf[off + i]
        i += 1
    for j in range(4):
        key_bytes[kid, length + j] = (group >> (24 - 8 * j)) & 255
    _table_insert(table, h, kid)
    return kid


def _table_insert(table, h, kid):
    mask = table.shape[0] - 1
    i = h & mask
    while table[i] != -1:
        i = (i + 1) & mask
    table[i] = _slot(h, kid)


def _table_delete(keys, table, kid):
    """Remove key row ``kid`` from the table, shifting its probe successors back (their home
    slots come from their fingerprints: no key row is read)."""
    mask = table.shape[0] - 1
    i = keys[kid, K_HASH] & mask
    while (table[i] & ROW_MASK) != kid:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        other = table[j]
        if other == -1:
            break
        home = (other >> 32) & mask
        # ``other`` may fill the hole at i unless its home lies cyclically in (i, j].
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            table[i] = other
            i = j
    table[i] = -1


def _free_key_row(keys, meta, kid):
    keys[kid, K_HEAD] = KEY_FREE_ROW
    keys[kid, K_TAIL] = meta[M_KEY_FREE]
    meta[M_KEY_FREE] = kid
    meta[M_KEY_USED] -= 1


def _emit(events, meta, kind, payload):
    """Append one event record, numbered from the pool's event counter."""
    r = meta[M_EV_LEN]
    events[r, EV_KIND] = kind
    events[r, EV_PAYLOAD] = payload
    events[r, EV_SEQ] = meta[M_EVENT_COUNT]
    meta[M_EV_LEN] = r + 1
    meta[M_EVENT_COUNT] += 1


def _link_at_key_tail(ent, keys, kid, e, b):
    """Make entry ``e`` (for block ``b``) the newest under key ``kid``: the key chain's tail."""
    last = keys[kid, K_TAIL]
    ent[e, E_BLOCK] = b
    ent[e, E_KPREV] = last
    ent[e, E_KNEXT] = -1
    if last == -1:
        keys[kid, K_HEAD] = e
        keys[kid, K_BLOCK] = b  # the earliest block under the key answers lookups
    else:
        ent[last, E_KNEXT] = e
    keys[kid, K_TAIL] = e


def _add_entry(blk, blk64, ent, keys, meta, kid, b, units):
    """Record the pair (key ``kid``, block ``b``): newest under the key, last on the block.

    It becomes the block's primary (with ``units`` hbs-units of tokens) if the block has none.
    """
    e = meta[M_ENT_FREE]
    if e != -1:
        meta[M_ENT_FREE] = ent[e, E_BNEXT]
    else:
        e = meta[M_ENT_HIGH]
        meta[M_ENT_HIGH] = e + 1
    meta[M_ENT_USED] += 1
    ent[e, E_KEY] = kid
    ent[e, E_BNEXT] = -1
    _link_at_key_tail(ent, keys, kid, e, b)
    first = _first(blk, b)
    if first == -1:
        _set_first(blk, b, e)
        blk64[b, TOKENS] = units
    else:
        while ent[first, E_BNEXT] != -1:
            first = ent[first, E_BNEXT]
        ent[first, E_BNEXT] = e


def _unlink_from_key(ent, keys, e):
    """Take entry ``e`` out of its key's chain (the key row keeps its other entries)."""
    kid = ent[e, E_KEY]
    p = ent[e, E_KPREV]
    q = ent[e, E_KNEXT]
    if p == -1:
        keys[kid, K_HEAD] = q
        keys[kid, K_BLOCK] = -1 if q == -1 else ent[q, E_BLOCK]
    else:
        ent[p, E_KNEXT] = q
    if q == -1:
        keys[kid, K_TAIL] = p
    else:
        ent[q, E_KPREV] = p


def _block_has_key(blk, ent, b, kid):
    """Whether the pair (``kid``, ``b``) is in the index (walks the block's short chain)."""
    e = _first(blk, b)
    while e != -1:
        if ent[e, E_KEY] == kid:
            return True
        e = ent[e, E_BNEXT]
    return False


def _remove_all_keys(blk, blk64, ent, keys, table, meta, events, b, events_on):
    """Strip every key of block ``b``: primary first, then secondaries in insertion order.

    One ``EV_REMOVED`` record per key when ``events_on``. A key left without blocks leaves the
    table; its row is freed now, or marked pending when an event must still read its bytes.
    """
    e = _first(blk, b)
    while e != -1:
        nxt = ent[e, E_BNEXT]
        kid = ent[e, E_KEY]
        _unlink_from_key(ent, keys, e)
        if events_on:
            _emit(events, meta, EV_REMOVED, kid)
        if keys[kid, K_HEAD] == -1:
            _table_delete(keys, table, kid)
            if events_on:
                keys[kid, K_HEAD] = KEY_PENDING_ROW
            else:
                _free_key_row(keys, meta, kid)
        ent[e, E_BLOCK] = -1
        ent[e, E_BNEXT] = meta[M_ENT_FREE]
        meta[M_ENT_FREE] = e
        meta[M_ENT_USED] -= 1
        e = nxt
    _set_first(blk, b, -1)
    blk64[b, TOKENS] = 0


def _room_for(ent, keys, key_bytes, table, meta, events, new_pairs, max_len, events_on):
    """Whether ``new_pairs`` more entries/keys (of at most ``max_len`` hash bytes) fit."""
    mask = table.shape[0] - 1
    if table.shape[0] < 2 or (table.shape[0] & mask) != 0:
        return False
    if ent.shape[0] - meta[M_ENT_USED] < new_pairs or keys.shape[0] - meta[M_KEY_USED] < new_pairs:
        return False
    if 2 * (meta[M_KEY_USED] + new_pairs) > table.shape[0]:
        return False
    if max_len + 4 > key_bytes.shape[1]:
        return False
    # Every removal in one call removes a live entry; at most one stored record follows.
    if events_on and events.shape[0] - meta[M_EV_LEN] < meta[M_ENT_USED] + 1:
        return False
    return True


def release_removed_keys(keys, meta, events):
    """Free the key rows that the last call's removal records kept pending; clear the records.

    keys int64 [K, KEY_COLS], meta int64 [META_SIZE], events int64 [R, EV_COLS].
    """
    keys, meta, events = _raw(keys), _raw(meta), _raw(events)
    _release_removed_keys(keys, meta, events)
    return OK


def _release_removed_keys(keys, meta, events):
    for r in range(meta[M_EV_LEN]):
        if events[r, EV_KIND] == EV_REMOVED:
            kid = events[r, EV_PAYLOAD]
            if keys[kid, K_HEAD] == KEY_PENDING_ROW:
                _free_key_row(keys, meta, kid)
    meta[M_EV_LEN] = 0


def report_removals(keys, key_bytes, meta, events, rows):
    """The last call's records as the removal events with integer hashes report them, then
    their key rows freed: row ``r`` of ``rows`` = (group id, external hash, seq) of record
    ``r``. The external hash is the block hash's last 8 bytes (all of a shorter one) read
    big-endian, as an int64 *bit pattern* (the caller masks it to 64 unsigned bits: a
    uint64 would not be computed alike compiled and plain); the group id is the key's last
    4 bytes, big-endian. What ``EventContext.external_of_key`` and ``keys.key_group`` read
    from the key's bytes, for a burst or one record, without a bytes object per key.

    keys int64 [K, KEY_COLS], key_bytes uint8 [K, stride], meta int64 [META_SIZE], events
    int64 [R, EV_COLS], rows int64 [>= records, 3]. Returns the number of records, or -1 —
    nothing read or freed — when a record is not a removal of a well-formed key row or
    ``rows`` is too short.
    """
    keys, key_bytes, meta, events, rows = (_raw(keys), _raw(key_bytes), _raw(meta),
                                           _raw(events), _raw(rows))
    count = int(meta[M_EV_LEN])
    if rows.shape[0] < count or events.shape[0] < count:
        return -1
    for r in range(count):  # (a removal names a key row holding a hash and a group id)
        kid = int(events[r, EV_PAYLOAD])
        if (events[r, EV_KIND] != EV_REMOVED or not 0 <= kid < keys.shape[0]
                or not 4 <= keys[kid, K_LEN] <= key_bytes.shape[1]):
            return -1
    return _write_removal_rows(keys, key_bytes, meta, events, rows, count)


def _write_removal_rows(keys, key_bytes, meta, events, rows, count):
    """:func:`report_removals`'s rows for ``count`` removal records (checked by the caller),
    then the key rows they kept pending freed."""
    for r in range(count):
        kid = int(events[r, EV_PAYLOAD])
        end = int(keys[kid, K_LEN]) - 4  # the hash's bytes end where the group id starts
        start = max(0, end - 8)
        top = int(key_bytes[kid, start]) if end > 0 else 0
        value = top - 256 if (end - start == 8 and top >= 128) else top  # the sign byte
        for j in range(start + 1, end):
            value = (value << 8) | int(key_bytes[kid, j])
        group = 0
        for j in range(end, end + 4):
            group = (group << 8) | int(key_bytes[kid, j])
        rows[r, 0] = group
        rows[r, 1] = value
        rows[r, 2] = events[r, EV_SEQ]
    _release_removed_keys(keys, meta, events)
    return count


def rehash(keys, table, meta):
    """Insert every live key row into ``table`` (new, all -1, power-of-two size > 2 * keys).

    keys int64 [K, KEY_COLS], table int64 [T], meta int64 [META_SIZE].
    """
    keys, table, meta = _raw(keys), _raw(table), _raw(meta)
    mask = table.shape[0] - 1
    if table.shape[0] < 2 * meta[M_KEY_USED] or (table.shape[0] & mask) != 0:
        return ERR_CAPACITY
    for kid in range(meta[M_KEY_HIGH]):
        if keys[kid, K_HEAD] >= 0:
            _table_insert(table, keys[kid, K_HASH], kid)
    return OK


# ===============================================================================================
# Pool operations (BEHAVIOUR.md §6; error order of kvpool.spec.preconditions)
# ===============================================================================================


def _lean_pop_refusal(meta, out, n):
    """Why a lean allocation of ``n`` blocks cannot run (``-code``), or 0: a bad count, too
    few free blocks, an output too small, or a pending watcher (the full kernel fires it)."""
    if n < 0:
        return -ERR_ARGUMENT
    if n > meta[M_NUM_FREE]:
        return -ERR_NO_FREE
    if n > out.shape[0]:
        return -ERR_CAPACITY
    if meta[M_NUM_WATCHERS] > 0:
        return -NEED_FULL
    return 0


def get_new_blocks_unkeyed(blk, meta, out, n):
    """Pop ``n`` blocks when none of them has a key and no watcher is pending (the lean path).

    blk int32 [N+2, BLK_COLS], meta int64 [META_SIZE], out int64 [>= n] (receives the ids).
    Returns the first id popped (0 when n == 0) on success, so that a one-block allocation
    needs no array read; otherwise ``-code``: ERR_ARGUMENT (n < 0), ERR_NO_FREE, or NEED_FULL
    (a popped block would need eviction, or a watcher exists: nothing changed, call
    :func:`get_new_blocks`).
    """
    blk, meta, out = _raw(blk), _raw(meta), _raw(out)
    refused = _lean_pop_refusal(meta, out, n)
    if refused:
        return refused
    head = blk.shape[0] - 2
    b = _next(blk, head)
    for i in range(n):  # read-only pass: the ids, and whether any needs eviction
        if _first(blk, b) != -1:
            return -NEED_FULL
        out[i] = b
        b = _next(blk, b)
    _set_next(blk, head, b)
    _set_prev(blk, b, head)
    for i in range(n):
        popped = out[i]
        _set_prev(blk, popped, -1)
        _set_next(blk, popped, -1)
        blk[popped, REF] = 1
    meta[M_NUM_FREE] -= n
    return int(out[0]) if n > 0 else 0


def get_new_blocks_quiet(blk, blk64, ent, keys, table, meta, out, caching, n):
    """Pop ``n`` blocks, evicting their keys, on a pool without events and without pending
    watchers (the lean path when :func:`get_new_blocks_unkeyed` declines for an eviction).

    Returns the first id popped (0 when n == 0), or ``-code``: ERR_ARGUMENT, ERR_NO_FREE,
    NEED_FULL (a watcher exists: nothing changed, call :func:`get_new_blocks`).
    """
    (blk, blk64, ent, keys, table, meta, out) = (
        _raw(blk), _raw(blk64), _raw(ent), _raw(keys), _raw(table), _raw(meta), _raw(out))
    refused = _lean_pop_refusal(meta, out, n)
    if refused:
        return refused
    meta[M_EV_LEN] = 0
    meta[M_FIRED_LEN] = 0
    # No events and no watchers: the events and fired arguments are never written, so any
    # array of their types stands in for them (fewer arguments: a cheaper call).
    _pop_front(blk, blk64, ent, keys, table, meta, blk64, out, out, n, caching, False)
    return int(out[0]) if n > 0 else 0


def get_new_blocks_reported(blk, blk64, ent, keys, key_bytes, table, meta, events, out, rows,
                            caching, n):
    """Pop ``n`` blocks, evicting their keys, on a pool with events and without pending
    watchers, and report the removals in the same call as :func:`report_removals` does
    (``rows``, then the key rows freed): the lean path when :func:`get_new_blocks_unkeyed`
    declines for an eviction on a pool whose events carry integer hashes.

    Returns the number of removal rows (the ids are in ``out``), or ``-code``: ERR_ARGUMENT,
    ERR_NO_FREE, NEED_FULL (a watcher exists), ERR_CAPACITY (``events`` or ``rows`` may be
    too short: nothing changed, take the full path, which grows them).
    """
    (blk, blk64, ent, keys, key_bytes, table, meta, events, out, rows) = (
        _raw(blk), _raw(blk64), _raw(ent), _raw(keys), _raw(key_bytes), _raw(table),
        _raw(meta), _raw(events), _raw(out), _raw(rows))
    refused = _lean_pop_refusal(meta, out, n)
    if refused:
        return refused
    # Every removal removes a live entry: one record and one row each at most.
    if events.shape[0] < meta[M_ENT_USED] + 1 or rows.shape[0] < meta[M_ENT_USED]:
        return -ERR_CAPACITY
    meta[M_EV_LEN] = 0
    meta[M_FIRED_LEN] = 0
    _pop_front(blk, blk64, ent, keys, table, meta, events, out, out, n, caching, True)
    return _write_removal_rows(keys, key_bytes, meta, events, rows, int(meta[M_EV_LEN]))


def get_new_blocks(blk, blk64, ent, keys, table, meta, events, out, fired, n, caching, events_on):
    """Pop ``n`` blocks off the front; fire watchers; evict keys (caching on); ref_cnt 1.

    Arrays as in the module docstring; out int64 [>= n] receives the ids in queue order,
    fired int64 [>= min(n, watchers)] the blocks whose watcher fires, in pop order
    (count in M_FIRED_LEN). One EV_REMOVED per evicted key when ``events_on``.
    Preconditions: 0 <= n (else ERR_ARGUMENT); n <= free (else ERR_NO_FREE).
    """
    (blk, blk64, ent, keys, table, meta, events, out, fired) = (
        _raw(blk), _raw(blk64), _raw(ent), _raw(keys), _raw(table), _raw(meta), _raw(events),
        _raw(out), _raw(fired))
    meta[M_EV_LEN] = 0
    meta[M_FIRED_LEN] = 0
    if n < 0:
        return ERR_ARGUMENT
    if n > meta[M_NUM_FREE]:
        return ERR_NO_FREE
    if n > out.shape[0] or fired.shape[0] < min(n, meta[M_NUM_WATCHERS]):
        return ERR_CAPACITY
    if events_on and events.shape[0] < meta[M_ENT_USED] + 1:
        return ERR_CAPACITY
    _pop_front(blk, blk64, ent, keys, table, meta, events, out, fired, n, caching, events_on)
    return OK


def _pop_front(blk, blk64, ent, keys, table, meta, events, out, fired, n, caching, events_on):
    """Pop ``n`` (validated) blocks into ``out``: watchers fire (into ``fired``, count in
    M_FIRED_LEN), keys are evicted when ``caching``, each block leaves with ref_cnt 1.

    Two passes, for the memory: the first walks the queue (one blk row per block) and unlinks
    the ``n`` blocks as one run; the second evicts in pop order while prefetching the rows
    that later blocks' evictions will chase (their entry rows in the first pass, key rows
    :data:`AHEAD` blocks ahead, table slots half that). The outcome is that of popping the
    blocks one by one: the same ids, order, keys removed (and their events) and watchers."""
    head = blk.shape[0] - 2
    b = _next(blk, head)
    for i in range(n):
        out[i] = b
        _prefetch(blk64, b)
        if caching:
            _prefetch(ent, _first(blk, b))
        b = _next(blk, b)
    _set_next(blk, head, b)
    _set_prev(blk, b, head)
    mask = table.shape[0] - 1
    num_fired = 0
    for i in range(n):
        if caching:
            _prefetch_eviction(blk, ent, keys, table, out, i + AHEAD, n, mask, False)
            _prefetch_eviction(blk, ent, keys, table, out, i + AHEAD // 2, n, mask, True)
        b = out[i]
        _set_prev(blk, b, -1)
        _set_next(blk, b, -1)
        if blk64[b, WATCH] != 0:
            fired[num_fired] = b
            num_fired += 1
            blk64[b, WATCH] = 0
            meta[M_NUM_WATCHERS] -= 1
        if caching and _first(blk, b) != -1:
            _remove_all_keys(blk, blk64, ent, keys, table, meta, events, b, events_on)
        blk[b, REF] = 1
    meta[M_NUM_FREE] -= n
    meta[M_FIRED_LEN] = num_fired


def _prefetch_eviction(blk, ent, keys, table, out, j, n, mask, slot):
    """Prefetch, for the ``j``-th block of ``out[:n]`` (if any), its primary key's row, or
    (``slot``) the home table slot of that key. Reads only rows an earlier stage prefetched;
    the block's own eviction has not run yet, so its entry and key rows are live."""
    if j < n:
        e = _first(blk, out[j])
        if e != -1:
            kid = ent[e, E_KEY]
            if slot:
                _prefetch(table, keys[kid, K_HASH] & mask)
            else:
                _prefetch(keys, kid)


def touch(blk, meta, ids):
    """One more reference per listed block; a free one leaves the queue. Null skipped.

    blk int32 [N+2, BLK_COLS], meta int64 [META_SIZE], ids int64 [m] (any values).
    Errors: ERR_BLOCK_ID, ERR_REF_OVERFLOW (M_ERR_INDEX = position).
    """
    blk, meta, ids = _raw(blk), _raw(meta), _raw(ids)
    n = blk.shape[0] - 2
    bad = _first_bad_id(ids, n)
    if bad >= 0:
        meta[M_ERR_INDEX] = bad
        return ERR_BLOCK_ID
    bad = _first_over_referenced(blk, ids)
    if bad >= 0:
        meta[M_ERR_INDEX] = bad
        return ERR_REF_OVERFLOW
    taken = 0  # one meta store at the end (see free_blocks on aliasing)
    for i in range(ids.shape[0]):
        taken += _take_ref(blk, ids[i])
    meta[M_NUM_FREE] -= taken
    return OK


def _first_over_referenced(blk, ids):
    """First position whose (non-null) block would pass MAX_REF_CNT if every listed
    reference were taken, or -1. The exact count runs only for a block near the limit
    (never, in practice), so the common batch costs one comparison per id."""
    m = ids.shape[0]
    limit = MAX_REF_CNT - m
    near = False
    for i in range(m):
        if blk[ids[i], REF] > limit:
            near = True
    if not near:
        return -1
    for i in range(m):
        b = ids[i]
        if b == 0 or blk[b, REF] <= limit:
            continue
        takes = 0
        for j in range(m):
            if ids[j] == b:
                takes += 1
        if int(blk[b, REF]) + takes > MAX_REF_CNT:
            return i
    return -1


def _take_ref(blk, b):
    """One more reference on in-range block ``b`` (null skipped); 1 if it left the queue."""
    if b == 0:
        return 0
    left = 0
    if blk[b, REF] == 0:
        _unlink(blk, b)
        left = 1
    blk[b, REF] += 1
    return left


def touch_one(blk, meta, b):
    """:func:`touch` of the batch ``[b]``, without an array (the one-block hot path)."""
    blk, meta = _raw(blk), _raw(meta)
    if b < 0 or b >= blk.shape[0] - 2:
        meta[M_ERR_INDEX] = 0
        return ERR_BLOCK_ID
    if b != 0 and blk[b, REF] >= MAX_REF_CNT:
        meta[M_ERR_INDEX] = 0
        return ERR_REF_OVERFLOW
    meta[M_NUM_FREE] -= _take_ref(blk, b)
    return OK


def _release(blk, b, caching, cursor):
    """Drop one reference of non-null ``b``; at 0 it rejoins the queue (the caller counts
    it into M_NUM_FREE). Returns the cursor.

    Unkeyed blocks (any block when caching is off) are linked after ``cursor`` — the head, or
    the previous front block of this batch — so a batch keeps its order at the front; keyed
    blocks go to the tail.
    """
    r = blk[b, REF] - 1
    blk[b, REF] = r
    if r == 0:
        if caching and _first(blk, b) != -1:
            _append(blk, b)
        else:
            _link_after(blk, cursor, b)
            return b
    return cursor


def free_blocks(blk, meta, caching, dry_run, ids):
    """Drop one reference per listed block; blocks reaching 0 rejoin the queue. Null skipped.

    Unkeyed blocks (any block when caching is off) go to the front in batch order, keyed ones
    to the tail in batch order. blk int32 [N+2, BLK_COLS], meta int64 [META_SIZE], ids int64
    [m] last (the state binds the rest once). Errors: ERR_BLOCK_ID, ERR_DOUBLE_FREE
    (M_ERR_INDEX = position). ``dry_run``: only validate (multi-pool routing checks every
    pool before any pool changes).
    """
    blk, meta, ids = _raw(blk), _raw(meta), _raw(ids)
    n = blk.shape[0] - 2
    bad = _first_bad_id(ids, n)
    if bad >= 0:
        meta[M_ERR_INDEX] = bad
        return ERR_BLOCK_ID
    bad = _first_over_released(blk, ids)
    if bad >= 0:
        meta[M_ERR_INDEX] = bad
        return ERR_DOUBLE_FREE
    if dry_run:
        return OK
    cursor = n  # the head sentinel
    # Counted locally, stored once: the compiler cannot rule out that meta and blk alias, so
    # a meta update per block would be stored and re-read around every blk store.
    freed = 0
    for i in range(ids.shape[0]):
        b = ids[i]
        if b != 0:
            cursor = _release(blk, b, caching, cursor)
            if blk[b, REF] == 0:
                freed += 1
    meta[M_NUM_FREE] += freed
    return OK


def free_one(blk, meta, caching, b):
    """:func:`free_blocks` of the batch ``[b]``, without an array (the one-block hot path)."""
    blk, meta = _raw(blk), _raw(meta)
    if b < 0 or b >= blk.shape[0] - 2:
        meta[M_ERR_INDEX] = 0
        return ERR_BLOCK_ID
    if b == 0:
        return OK
    if blk[b, REF] == 0:
        meta[M_ERR_INDEX] = 0
        return ERR_DOUBLE_FREE
    _release(blk, b, caching, blk.shape[0] - 2)
    if blk[b, REF] == 0:
        meta[M_NUM_FREE] += 1
    return OK


def unpin_blocks(blk, blk64, meta, ids):
    """Release references that stay readable until reallocation; register watchers.

    A block without a watcher gets the next stamp (a watched block keeps its place); blocks
    reaching ref 0 go to the tail in batch order. blk int32 [N+2, BLK_COLS], blk64 int64
    [N+2, BLK64_COLS], meta int64 [META_SIZE], ids int64 [m].
    Errors: ERR_BLOCK_ID, ERR_NULL_BLOCK, ERR_DOUBLE_FREE (M_ERR_INDEX = position).
    """
    blk, blk64, meta, ids = _raw(blk), _raw(blk64), _raw(meta), _raw(ids)
    n = blk.shape[0] - 2
    bad = _first_bad_id(ids, n)
    if bad >= 0:
        meta[M_ERR_INDEX] = bad
        return ERR_BLOCK_ID
    for i in range(ids.shape[0]):
        if ids[i] == 0:
            meta[M_ERR_INDEX] = i
            return ERR_NULL_BLOCK
    bad = _first_over_released(blk, ids)
    if bad >= 0:
        meta[M_ERR_INDEX] = bad
        return ERR_DOUBLE_FREE
    clock = meta[M_WATCH_CLOCK]
    watched = 0
    freed = 0
    for i in range(ids.shape[0]):
        b = ids[i]
        r = blk[b, REF] - 1
        blk[b, REF] = r
        if blk64[b, WATCH] == 0:
            clock += 1
            blk64[b, WATCH] = clock
            watched += 1
        if r == 0:
            _append(blk, b)
            freed += 1
    meta[M_WATCH_CLOCK] = clock
    meta[M_NUM_WATCHERS] += watched
    meta[M_NUM_FREE] += freed
    return OK


def _lookup_arguments_ok(buf, lens, groups, out):
    """What a lookup reads is there: lengths non-negative and within ``buf``, ``out`` one
    row per group and one column per key, every group in ``[0, 2**32)``."""
    q = lens.shape[0]
    total = 0
    for i in range(q):
        if lens[i] < 0:
            return False
        total += lens[i]
    if total > buf.shape[0] or out.shape[0] < groups.shape[0] or out.shape[1] < q:
        return False
    for j in range(groups.shape[0]):
        if groups[j] < 0 or groups[j] > 0xFFFFFFFF:
            return False
    return True


def lookup_blocks(ent, keys, key_bytes, table, meta, buf, lens, groups, out):
    """Longest prefix of keys hit in every group; per group, the earliest block of each key.

    buf uint8 [sum(lens)] holds the hashes back to back, lens int64 [q] their lengths,
    groups int64 [g] (each in [0, 2**32)), out int64 [g, >= q]. M_RESULT = hit positions.
    ``get_cached_block`` is the case q = 1 (hit iff M_RESULT == 1). Pure.
    """
    (ent, keys, key_bytes, table, meta, buf, lens, groups, out) = (
        _raw(ent), _raw(keys), _raw(key_bytes), _raw(table), _raw(meta), _raw(buf), _raw(lens),
        _raw(groups), _raw(out))
    meta[M_RESULT] = 0
    if not _lookup_arguments_ok(buf, lens, groups, out):
        return ERR_ARGUMENT
    off = 0
    for i in range(lens.shape[0]):
        length = lens[i]
        if not _hit_in_every_group(keys, key_bytes, table, buf, off, length, groups, out, i):
            return OK
        off += length
        meta[M_RESULT] = i + 1
    return OK


def _hit_in_every_group(keys, key_bytes, table, buf, off, length, groups, out, i):
    """Whether the key ``buf[off:off+length]`` is cached in every group; ``out[j, i]`` gets
    its block in group ``j`` for each group read (up to the first miss)."""
    for j in range(groups.shape[0]):
        g = groups[j]
        kid = _find_key(keys, key_bytes, table, buf, off, length, g,
                        _hash_key(buf, off, length, g))
        if kid == -1:
            return False
        out[j, i] = keys[kid, K_BLOCK]
    return True


def lookup_each(keys, key_bytes, table, meta, buf, lens, groups, out):
    """``get_cached_block`` for every key, each on its own (a miss does not end the scan).

    buf, lens, groups as in :func:`lookup_blocks`; out int64 [g, >= q]: ``out[j, i]`` the
    block of key ``i`` in group ``j`` when key ``i`` hits in every group, and
    ``out[0, i] = -1`` when it misses in some group (its other rows then unspecified).
    M_RESULT = number of positions that hit. Pure.
    """
    (keys, key_bytes, table, meta, buf, lens, groups, out) = (
        _raw(keys), _raw(key_bytes), _raw(table), _raw(meta), _raw(buf), _raw(lens),
        _raw(groups), _raw(out))
    meta[M_RESULT] = 0
    if groups.shape[0] < 1 or not _lookup_arguments_ok(buf, lens, groups, out):
        return ERR_ARGUMENT
    off = 0
    hits = 0
    for i in range(lens.shape[0]):
        length = lens[i]
        if _hit_in_every_group(keys, key_bytes, table, buf, off, length, groups, out, i):
            hits += 1
        else:
            out[0, i] = -1
        off += length
    meta[M_RESULT] = hits
    return OK


def lookup_run_from_end(keys, key_bytes, table, meta, buf, lens, groups, out, run_length,
                        end_every, end_shift):
    """The rightmost run of ``run_length`` keys that hit in every group and whose last
    position ``p`` may end one (``(p + 1 - end_shift) % end_every == 0``); without one, the
    longest run from key 0 that ends so (:func:`kvpool.batch.cached_run_from_end` defines
    it). Keys are read from the last one back, each at most once.

    buf, lens, groups as in :func:`lookup_blocks` (the keys of positions ``[0, q)``); out
    int64 [g, >= q]: ``out[j, i]`` the block of key ``i`` in group ``j`` for each ``i`` of
    the run. Returns the run's first position (>= 0; M_RESULT = its end, exclusive), or
    ``-ERR_ARGUMENT`` (``run_length`` or ``end_every`` below 1, ``end_shift`` negative, or
    the arrays as :func:`lookup_blocks` refuses them). Pure.
    """
    (keys, key_bytes, table, meta, buf, lens, groups, out) = (
        _raw(keys), _raw(key_bytes), _raw(table), _raw(meta), _raw(buf), _raw(lens),
        _raw(groups), _raw(out))
    meta[M_RESULT] = 0
    if (groups.shape[0] < 1 or run_length < 1 or end_every < 1 or end_shift < 0
            or not _lookup_arguments_ok(buf, lens, groups, out)):
        return -ERR_ARGUMENT
    end = 0  # the offset just past key i, walked back from the last key
    for i in range(lens.shape[0]):
        end += lens[i]
    run = 0
    for i in range(lens.shape[0] - 1, -1, -1):
        length = lens[i]
        end -= length
        if run == 0 and (i + 1 - end_shift) % end_every != 0:
            continue  # a run cannot end here (the key is not read)
        if not _hit_in_every_group(keys, key_bytes, table, buf, end, length, groups, out, i):
            run = 0
            continue
        run += 1
        if run == run_length:
            meta[M_RESULT] = i + run
            return i
    meta[M_RESULT] = run  # the run that reaches key 0, possibly empty
    return 0


def lookup_one(keys, key_bytes, table, block_hash, group):
    """``get_cached_block`` for one hash and one group: the key's earliest block, or -1.

    block_hash: the hash as ``bytes`` (read in place); group in [0, 2**32) (the shell
    checks). Pure.
    """
    keys, key_bytes, table = _raw(keys), _raw(key_bytes), _raw(table)
    length = len(block_hash)
    kid = _find_key(keys, key_bytes, table, block_hash, 0, length, group,
                    _hash_key(block_hash, 0, length, group))
    return -1 if kid == -1 else int(keys[kid, K_BLOCK])


def _hash_bytes_needed(buf, lens, m):
    """Longest of the first ``m`` hash lengths, or -1 if ``lens``/``buf`` cannot hold them."""
    if lens.shape[0] < m:
        return -1
    total = 0
    longest = 0
    for i in range(m):
        if lens[i] < 0:
            return -1
        total += lens[i]
        longest = max(longest, lens[i])
    if total > buf.shape[0]:
        return -1
    return longest


def _cache_arguments_ok(lens, mask, m, num_cached, ratio, group, use_mask, longest):
    """Shapes and scalars of a cache write are what the shell promised (defence in depth)."""
    if longest < 0 or lens.shape[0] != m or (use_mask and mask.shape[0] != m):
        return False
    return 0 <= group <= 0xFFFFFFFF and ratio >= 1 and num_cached >= 0


def _check_candidates(blk, blk64, meta, cand, mask, num_cached, ratio, use_mask):
    """The first failing cache_full_blocks check on the selected candidates, in spec order.

    Per selected (non-null, unmasked) candidate: listed twice → ERR_DUPLICATE, ref 0 →
    ERR_FREE_BLOCK, key covering >= its tokens → ERR_KEYED (M_ERR_INDEX = position). MARK
    bit 2 set by the caller means "allocated by this very call": ref 1 and no key by then.
    Sets MARK bit 1 on the blocks it passes; the caller clears MARK.
    """
    for i in range(cand.shape[0]):
        b = cand[i]
        if b == 0 or (use_mask and mask[i] == 0):
            continue
        mark = blk[b, MARK]
        code = OK
        if mark & 1:
            code = ERR_DUPLICATE
        elif mark & 2 == 0:
            code = _candidate_refusal(blk, blk64, b, num_cached + i, ratio)
        if code != OK:
            meta[M_ERR_INDEX] = i
            return code
        blk[b, MARK] = mark | 1
    return OK


def _candidate_refusal(blk, blk64, b, position, ratio):
    """Why block ``b`` (not null, not allocated by this call) cannot be keyed at table
    ``position``: ERR_FREE_BLOCK (ref 0), ERR_KEYED (a key already covers its tokens), or OK."""
    if blk[b, REF] == 0:
        return ERR_FREE_BLOCK
    if _first(blk, b) != -1 and blk64[b, TOKENS] >= (position + 1) * ratio:
        return ERR_KEYED
    return OK


def _key_block(blk, blk64, ent, keys, key_bytes, table, meta, events, b, buf, off, length,
               group, units, events_on):
    """Key validated block ``b`` with hash ``buf[off:off+length]`` covering ``units``
    hbs-units: its old keys go first (a promotion, EV_REMOVED each), then the new primary."""
    if _first(blk, b) != -1:
        _remove_all_keys(blk, blk64, ent, keys, table, meta, events, b, events_on)
    _key_unkeyed_block(blk, blk64, ent, keys, key_bytes, table, meta, b, buf, off, length,
                       group, units)


def _key_unkeyed_block(blk, blk64, ent, keys, key_bytes, table, meta, b, buf, off, length,
                       group, units):
    """:func:`_key_block` of a block that has no key: the key found or stored, the pair added."""
    h = _hash_key(buf, off, length, group)
    kid = _find_key(keys, key_bytes, table, buf, off, length, group, h)
    if kid == -1:
        kid = _new_key(keys, key_bytes, table, meta, buf, off, length, group, h)
    _add_entry(blk, blk64, ent, keys, meta, kid, b, units)


def _cache_candidates(blk, blk64, ent, keys, key_bytes, table, meta, events, cand, mask, buf,
                      lens, num_cached, ratio, group, use_mask, events_on, payload):
    """Key every selected candidate (validated): promotion removals, then the new primary;
    then one EV_STORED record carrying ``payload`` when ``events_on``."""
    off = 0
    for i in range(cand.shape[0]):
        b = cand[i]
        length = lens[i]
        if b != 0 and not (use_mask and mask[i] == 0):
            _key_block(blk, blk64, ent, keys, key_bytes, table, meta, events, b, buf, off,
                       length, group, (num_cached + i + 1) * ratio, events_on)
        off += length
    if events_on:
        _emit(events, meta, EV_STORED, payload)


def cache_full_blocks(s, cand, mask, buf, lens, num_cached, ratio, group, use_mask, events_on):
    """Key candidates ``cand[i]`` (table position ``num_cached + i``) with hash i of ``buf``.

    Null and masked-out candidates are skipped; a keyed candidate is promoted (its keys go
    first, EV_REMOVED each); the new key becomes its primary covering ``(position+1)·ratio``
    hbs-units (ratio = block_size / hbs). One EV_STORED closes the call when ``events_on``.
    cand int64 [m], mask uint8 [m] (read iff ``use_mask``), buf uint8 [sum(lens)] the hashes
    back to back, lens int64 [m], group in [0, 2**32). Errors in the spec's order:
    ERR_BLOCK_ID, then those of :func:`_check_candidates`.
    """
    (blk, blk64, ent, keys, key_bytes, table, meta, events, cand, mask, buf, lens) = (
        _raw(s.blk), _raw(s.blk64), _raw(s.ent), _raw(s.keys), _raw(s.key_bytes),
        _raw(s.table), _raw(s.meta),
        _raw(s.events), _raw(cand), _raw(mask), _raw(buf), _raw(lens))
    meta[M_EV_LEN] = 0
    n = blk.shape[0] - 2
    m = cand.shape[0]
    bad = _first_bad_id(cand, n)
    if bad >= 0:
        meta[M_ERR_INDEX] = bad
        return ERR_BLOCK_ID
    longest = _hash_bytes_needed(buf, lens, m)
    if not _cache_arguments_ok(lens, mask, m, num_cached, ratio, group, use_mask, longest):
        return ERR_ARGUMENT
    code = _check_candidates(blk, blk64, meta, cand, mask, num_cached, ratio, use_mask)
    for i in range(m):
        blk[cand[i], MARK] = 0
    if code != OK:
        return code
    if not _room_for(ent, keys, key_bytes, table, meta, events, m, longest, events_on):
        return ERR_CAPACITY
    _cache_candidates(blk, blk64, ent, keys, key_bytes, table, meta, events, cand, mask, buf,
                      lens, num_cached, ratio, group, use_mask, events_on, 0)
    return OK


def cache_one(s, b, block_hash, position, group, events_on):
    """:func:`cache_full_blocks` of the one candidate ``b`` at table position ``position``,
    hashed ``block_hash`` (``bytes``, read in place), block size = hash block size: a decode
    step's write, without the arrays a batch needs. Same checks in the same order, same
    state, same records; two refusals that change nothing send the caller to
    :func:`cache_full_blocks`: NEED_FULL for a block that has a key already (a promotion,
    rare, and left out of this kernel to keep its compile short) and ERR_CAPACITY."""
    blk, blk64, ent, keys, key_bytes, table, meta, events = (
        _raw(s.blk), _raw(s.blk64), _raw(s.ent), _raw(s.keys), _raw(s.key_bytes),
        _raw(s.table),
        _raw(s.meta), _raw(s.events))
    meta[M_EV_LEN] = 0
    if b < 0 or b >= blk.shape[0] - 2:
        meta[M_ERR_INDEX] = 0
        return ERR_BLOCK_ID
    if position < 0 or group < 0 or group > 0xFFFFFFFF:
        return ERR_ARGUMENT
    length = len(block_hash)
    if b != 0:
        code = _candidate_refusal(blk, blk64, b, position, 1)
        if code != OK:
            meta[M_ERR_INDEX] = 0
            return code
        if _first(blk, b) != -1:
            return NEED_FULL
    if not _room_for(ent, keys, key_bytes, table, meta, events, 1, length, events_on):
        return ERR_CAPACITY
    if b != 0:
        _key_unkeyed_block(blk, blk64, ent, keys, key_bytes, table, meta, b, block_hash, 0,
                           length, group, position + 1)
    if events_on:
        _emit(events, meta, EV_STORED, 0)
    return OK


def take_and_key(s, n, b, block_hash, position, group):
    """A running request's step across a block boundary, on a prefix-caching pool without
    events and without pending watchers: :func:`get_new_blocks_quiet` of ``n`` (>= 1)
    blocks, then :func:`cache_one` of its filled block ``b`` (at table position
    ``position``, hashed ``block_hash``, a block it held before: never one popped here).
    Both are checked before either runs; the pop cannot change what the write checks (it
    takes only free blocks, ``b`` is held, and an eviction only frees index rows).

    Returns the first id popped (the ids land in ``out``), or ``-code`` with nothing
    changed: ERR_ARGUMENT, ERR_NO_FREE, ERR_CAPACITY, NEED_FULL (a watcher is pending, or
    ``b`` has a key: a promotion), ERR_BLOCK_ID, ERR_FREE_BLOCK, ERR_KEYED. The caller then
    runs the two verbs, which say why. ``events`` is never read (no events).
    """
    (blk, blk64, ent, keys, key_bytes, table, meta, out) = (
        _raw(s.blk), _raw(s.blk64), _raw(s.ent), _raw(s.keys), _raw(s.key_bytes),
        _raw(s.table),
        _raw(s.meta), _raw(s.out))
    if n < 1:
        return -ERR_ARGUMENT
    refused = _lean_pop_refusal(meta, out, n)
    if refused:
        return refused
    if b <= 0 or b >= blk.shape[0] - 2:
        return -ERR_BLOCK_ID
    if position < 0 or group < 0 or group > 0xFFFFFFFF:
        return -ERR_ARGUMENT
    code = _candidate_refusal(blk, blk64, b, position, 1)
    if code != OK:
        return -code
    if _first(blk, b) != -1:
        return -NEED_FULL
    length = len(block_hash)
    if not _room_for(ent, keys, key_bytes, table, meta, blk64, 1, length, False):
        return -ERR_CAPACITY
    meta[M_EV_LEN] = 0
    meta[M_FIRED_LEN] = 0
    _pop_front(blk, blk64, ent, keys, table, meta, blk64, out, out, n, True, False)
    _key_unkeyed_block(blk, blk64, ent, keys, key_bytes, table, meta, b, block_hash, 0,
                       length, group, position + 1)
    return int(out[0])


def group_step(s, caching, plan, buf, n, reserve):
    """A running request's step across a hybrid model's groups, on a pool without events and
    without pending watchers: :func:`free_blocks` of each release list in turn, then, when
    ``n + reserve`` blocks are free, :func:`get_new_blocks_quiet` of ``n`` blocks and
    :func:`cache_one` of each write. The generic policy's order (windows free, every group
    takes, every group keys) in one call; every part is checked before any runs.

    plan int64: ``[t, <t list lengths>, w, <w writes: block, table position, group, hash
    length>, <the release lists back to back>]`` (each list freed in its order, as one
    ``free_blocks`` call: its own front batch); buf uint8: the writes' hashes back to back.
    A write's block is held (not one released or popped here) and has no key yet: the block
    that filled. out int64 [>= n] receives the new ids.

    Returns OK, or a code with nothing changed: ERR_ARGUMENT, ERR_CAPACITY, ERR_BLOCK_ID,
    ERR_DOUBLE_FREE (a released block that is free), ERR_FREE_BLOCK, ERR_KEYED, ERR_NO_FREE
    (fewer than ``n + reserve`` free blocks after the releases: the caller's budget refuses),
    NEED_FULL (a watcher is pending, a block listed twice, a write on a keyed block). The
    caller then runs the verbs, which do it or say why. ``events`` is never written.
    """
    (blk, blk64, ent, keys, key_bytes, table, meta, out, plan, buf) = (
        _raw(s.blk), _raw(s.blk64), _raw(s.ent), _raw(s.keys), _raw(s.key_bytes),
        _raw(s.table),
        _raw(s.meta), _raw(s.out), _raw(plan), _raw(buf))
    size = plan.shape[0]
    if size < 2 or n < 0 or reserve < 0:
        return ERR_ARGUMENT
    t = plan[0]
    if t < 0 or t > size - 2:
        return ERR_ARGUMENT
    released = 0
    for j in range(1, t + 1):
        if plan[j] < 0 or plan[j] > STEP_LIMIT:
            return ERR_ARGUMENT
        released += plan[j]
    w = plan[t + 1]
    if w < 0 or w > STEP_LIMIT or size != t + 2 + 4 * w + released:
        return ERR_ARGUMENT
    freed = plan[t + 2 + 4 * w :]
    first_write = t + 2
    end_writes = first_write + 4 * w
    hash_bytes = 0
    longest = 0
    for i in range(first_write, end_writes, 4):
        length = plan[i + 3]
        if plan[i + 1] < 0 or plan[i + 1] > POSITION_LIMIT or plan[i + 2] < 0 \
                or plan[i + 2] > 0xFFFFFFFF or length < 0 or length > buf.shape[0]:
            return ERR_ARGUMENT
        hash_bytes += length
        if length > longest:
            longest = length
    if hash_bytes != buf.shape[0] or (w > 0 and not caching):
        return ERR_ARGUMENT
    if n > out.shape[0]:
        return ERR_CAPACITY
    if meta[M_NUM_WATCHERS] > 0:
        return NEED_FULL
    num_blocks = blk.shape[0] - 2
    if _first_bad_id(freed, num_blocks) >= 0:
        return ERR_BLOCK_ID
    for i in range(first_write, end_writes, 4):
        if plan[i] <= 0 or plan[i] >= num_blocks:
            return ERR_BLOCK_ID
    # MARK flags every block named so far: a second mention declines.
    code = OK
    zeroed = 0  # released blocks that reach ref 0 and rejoin the queue
    for i in range(freed.shape[0]):
        b = freed[i]
        if b != 0:
            if blk[b, MARK] != 0:
                code = NEED_FULL
                break
            if blk[b, REF] == 0:
                code = ERR_DOUBLE_FREE
                break
            blk[b, MARK] = 1
            if blk[b, REF] == 1:
                zeroed += 1
    if code == OK:
        for i in range(first_write, end_writes, 4):
            b = plan[i]
            if blk[b, MARK] != 0 or _first(blk, b) != -1:
                code = NEED_FULL
            else:
                code = _candidate_refusal(blk, blk64, b, plan[i + 1], 1)
            if code != OK:
                break
            blk[b, MARK] = 1
    for i in range(freed.shape[0]):
        blk[freed[i], MARK] = 0
    for i in range(first_write, end_writes, 4):
        blk[plan[i], MARK] = 0
    if code != OK:
        return code
    if reserve > meta[M_NUM_FREE] + zeroed - n:
        return ERR_NO_FREE
    if w > 0 and not _room_for(ent, keys, key_bytes, table, meta, blk64, w, longest, False):
        return ERR_CAPACITY
    meta[M_EV_LEN] = 0
    meta[M_FIRED_LEN] = 0
    start = 0
    for j in range(1, t + 1):
        cursor = num_blocks  # each list is one free_blocks call: its front batch at the head
        for x in range(start, start + plan[j]):
            b = freed[x]
            if b != 0:
                cursor = _release(blk, b, caching, cursor)
        start += plan[j]
    meta[M_NUM_FREE] += zeroed
    # No watcher is pending and no events: fired and events are never written.
    _pop_front(blk, blk64, ent, keys, table, meta, blk64, out, out, n, caching, False)
    off = 0
    for i in range(first_write, end_writes, 4):
        length = plan[i + 3]
        _key_unkeyed_block(blk, blk64, ent, keys, key_bytes, table, meta, plan[i], buf, off,
                           length, plan[i + 2], plan[i + 1] + 1)
        off += length
    return OK


def allocate_and_cache(s, cand, num_old, first_new, mask, buf, lens, n, num_cached, ratio, group,
                       use_mask, events_on, dry_run):
    """:func:`get_new_blocks` (caching on) then :func:`cache_full_blocks`, validated as one.

    cand int64 [m]: the candidates ``table[num_cached:num_full]`` of the table
    ``old blocks ‖ new blocks``; ``cand[:num_old]`` come from the caller, the rest are filled
    here with ``out[first_new:]`` (the blocks this call allocates). The cache step is checked
    against the state the allocation will leave (allocated blocks: ref 1, no key), so an error
    changes nothing. No watcher may be pending (else NEED_FULL) unless ``dry_run``: then
    the call only validates, and the caller runs the two verbs itself (watchers and metrics
    must fire between them). out int64 [>= n] receives the new ids. Errors: ERR_ARGUMENT,
    ERR_NO_FREE, then those of :func:`cache_full_blocks` (M_ERR_INDEX = position in cand).
    """
    (blk, blk64, ent, keys, key_bytes, table, meta, events, out, cand, mask, buf, lens) = (
        _raw(s.blk), _raw(s.blk64), _raw(s.ent), _raw(s.keys), _raw(s.key_bytes),
        _raw(s.table), _raw(s.meta),
        _raw(s.events), _raw(s.out), _raw(cand), _raw(mask), _raw(buf), _raw(lens))
    meta[M_EV_LEN] = 0
    meta[M_FIRED_LEN] = 0
    num_blocks = blk.shape[0] - 2
    m = cand.shape[0]
    if n < 0:
        return ERR_ARGUMENT
    if n > meta[M_NUM_FREE]:
        return ERR_NO_FREE
    if n > out.shape[0] or num_old < 0 or num_old > m or first_new < 0:
        return ERR_CAPACITY
    if first_new + (m - num_old) > n:
        return ERR_ARGUMENT
    if meta[M_NUM_WATCHERS] > 0 and not dry_run:
        return NEED_FULL
    for i in range(num_old):
        if cand[i] < 0 or cand[i] >= num_blocks:
            meta[M_ERR_INDEX] = i
            return ERR_BLOCK_ID
    longest = _hash_bytes_needed(buf, lens, m)
    if not _cache_arguments_ok(lens, mask, m, num_cached, ratio, group, use_mask, longest):
        return ERR_ARGUMENT
    head = num_blocks
    b = _next(blk, head)
    for i in range(n):  # peek at the blocks the allocation will pop
        out[i] = b
        blk[b, MARK] = 2
        b = _next(blk, b)
    for i in range(num_old, m):
        cand[i] = out[first_new + i - num_old]
    code = _check_candidates(blk, blk64, meta, cand, mask, num_cached, ratio, use_mask)
    for i in range(m):
        blk[cand[i], MARK] = 0
    for i in range(n):
        blk[out[i], MARK] = 0
    if code != OK:
        return code
    if not _room_for(ent, keys, key_bytes, table, meta, events, m, longest, events_on):
        return ERR_CAPACITY
    if dry_run:
        return OK
    # No watcher is pending (checked above), so the fired buffer stays empty.
    _pop_front(blk, blk64, ent, keys, table, meta, events, out, out[:0], n, True, events_on)
    _cache_candidates(blk, blk64, ent, keys, key_bytes, table, meta, events, cand, mask, buf,
                      lens, num_cached, ratio, group, use_mask, events_on, 0)
    return OK


# ===============================================================================================
# Batch verbs (their definitions, as compositions of the verbs above: kvpool.batch)
# ===============================================================================================

MARK_POPPED = 1 << 30  # _check_releases: the block is among those the allocation pops
STEP_LIMIT = 1 << 28  # bound on a step's candidates and released ids (MARK holds their counts)
POSITION_LIMIT = 1 << 31  # bound on positions and ratios: their products fit int64


def admit_request(s, memo, buf, lens, max_hit, num_blocks, num_full, reserve, ratio, group, known,
                  caching, events_on):
    """``kvpool.batch.admit``: lookup, admission test, touch the hits, allocate, cache.

    buf/lens: the request's hashes at block granularity, back to back (at least ``num_full``
    of them when ``caching``; the lookup reads at most ``max_hit``). out int64
    [>= num_blocks] receives the table: the hits, then the new blocks. M_RESULT = number of
    hits. memo int64 [2, >= num_blocks]: row and generation of the key each hit position
    matched, written by the scan; its first ``known`` positions come from an earlier scan of
    the same hashes in the same group, and a position whose key row still holds that
    generation is a hit without probing (the key is the same, still live). Returns OK,
    REFUSED (``new + evictable hits + reserve > free``: nothing changed),
    NEED_FULL (a watcher is pending: nothing changed, the caller runs the composition so
    that callbacks fire in place), ERR_ARGUMENT or ERR_CAPACITY. The candidates of the cache
    step are the blocks just allocated (ref 1, no key), so it cannot fail.
    """
    (blk, blk64, ent, keys, key_bytes, table, meta, events, out, memo, buf, lens) = (
        _raw(s.blk), _raw(s.blk64), _raw(s.ent), _raw(s.keys), _raw(s.key_bytes),
        _raw(s.table), _raw(s.meta),
        _raw(s.events), _raw(s.out), _raw(memo), _raw(buf), _raw(lens))
    meta[M_EV_LEN] = 0
    meta[M_FIRED_LEN] = 0
    meta[M_RESULT] = 0
    if (max_hit < 0 or num_full < 0 or reserve < 0 or max_hit > num_blocks
            or num_full > num_blocks or num_blocks > out.shape[0] or ratio < 1
            or ratio > POSITION_LIMIT or group < 0 or group > 0xFFFFFFFF
            or memo.shape[0] != 2 or memo.shape[1] < num_blocks):
        return ERR_ARGUMENT
    q = lens.shape[0]
    if (caching and num_full > q) or _hash_bytes_needed(buf, lens, q) < 0:
        return ERR_ARGUMENT
    if meta[M_NUM_WATCHERS] > 0:
        return NEED_FULL
    free = meta[M_NUM_FREE]
    limit = min(max_hit, q) if caching else 0
    # The test fails whatever the scan finds when even the best case (every position a
    # held hit) fails, and fails as soon as the evictable hits found make it fail: the scan
    # is pure, so stopping early is not observable. (Compared without forming sums: a huge
    # reserve must not wrap around.)
    if reserve > free or num_blocks - limit > free - reserve:
        meta[M_RESULT] = min(known, limit)  # the memo is as it was
        return REFUSED
    h = 0
    off = 0
    evictable = 0
    key_high = meta[M_KEY_HIGH]
    while h < limit:
        length = lens[h]
        kid = memo[0, h] if h < known else -1
        if not (0 <= kid < key_high and keys[kid, K_HEAD] >= 0
                and keys[kid, K_GEN] == memo[1, h]):
            known = 0  # from here on, probe
            kid = _find_key(keys, key_bytes, table, buf, off, length, group,
                            _hash_key(buf, off, length, group))
            if kid == -1:
                break
            memo[0, h] = kid
            memo[1, h] = keys[kid, K_GEN]
        b = keys[kid, K_BLOCK]
        out[h] = b
        if blk[b, REF] > MAX_REF_CNT - num_blocks:
            return NEED_FULL  # the composition's touch reports the overflow
        if blk[b, REF] == 0:
            evictable += 1
            if num_blocks - limit + evictable > free - reserve:
                meta[M_RESULT] = h + 1
                return REFUSED
        off += length
        h += 1
    meta[M_RESULT] = h
    num_new = num_blocks - h
    if num_new + evictable > free - reserve:
        return REFUSED
    m = num_full - h if caching and num_full > h else 0
    longest = 0
    for i in range(h, h + m):
        longest = max(longest, lens[i])
    if not _room_for(ent, keys, key_bytes, table, meta, events, m, longest, events_on):
        return ERR_CAPACITY
    taken = 0
    for i in range(h):
        b = out[i]
        if blk[b, REF] == 0:
            _unlink(blk, b)
            taken += 1
        blk[b, REF] += 1
    meta[M_NUM_FREE] -= taken
    # No watcher is pending (checked above), so the fired buffer stays empty.
    _pop_front(blk, blk64, ent, keys, table, meta, events, out[h:], out[:0], num_new, caching,
               events_on)
    if m > 0:
        _cache_candidates(blk, blk64, ent, keys, key_bytes, table, meta, events,
                          out[h:num_full], buf[:0], buf[off:], lens[h:num_full], h, ratio, group,
                          False, events_on, 0)
    return OK


def _check_step_items(blk, blk64, plan, m, total, ratio):
    """The candidate checks of each cache item of a step plan, in turn: ERR_DUPLICATE,
    ERR_FREE_BLOCK, ERR_KEYED (ids are in range), each item seeing the keys that the earlier
    items set. MARK holds ``2·(g+1)`` for the latest candidate ``g`` that keyed the block,
    plus bit 1 while the block is seen in the current item; cleared before returning."""
    units = np.empty(total, np.int64)
    code = OK
    pos = 3
    g0 = 0
    for _ in range(m):
        c = plan[pos]
        count = plan[pos + 1]
        for x in range(count):
            b = plan[pos + 2 + x]
            if b == 0:
                continue
            mark = blk[b, MARK]
            if mark & 1:
                code = ERR_DUPLICATE
            elif blk[b, REF] == 0:
                code = ERR_FREE_BLOCK
            else:
                prev = (mark >> 1) - 1
                if prev >= 0:
                    current = units[prev]
                elif _first(blk, b) != -1:
                    current = blk64[b, TOKENS]
                else:
                    current = -1
                if current >= (c + x + 1) * ratio:
                    code = ERR_KEYED
            if code != OK:
                break
            blk[b, MARK] = mark | 1
        if code != OK:
            break
        for x in range(count):
            b = plan[pos + 2 + x]
            if b != 0:
                units[g0 + x] = (c + x + 1) * ratio
                blk[b, MARK] = 2 * (g0 + x + 1)
        pos += 2 + count
        g0 += count
    pos = 3
    for _ in range(m):
        count = plan[pos + 1]
        for x in range(count):
            blk[plan[pos + 2 + x], MARK] = 0
        pos += 2 + count
    return code


def _check_releases(blk, freed, n):
    """ERR_DOUBLE_FREE if releasing every id of ``freed`` (null skipped, ids in range) after
    popping ``n`` blocks drops some block below zero, else OK. Releases in several tables add
    up, so one count per block decides; a popped block counts one reference more. Uses MARK
    (cleared before returning)."""
    if freed.shape[0] == 0:
        return OK
    head = blk.shape[0] - 2
    b = _next(blk, head)
    for _ in range(n):
        blk[b, MARK] = MARK_POPPED
        b = _next(blk, b)
    for i in range(freed.shape[0]):
        if freed[i] != 0:
            blk[freed[i], MARK] += 1
    code = OK
    for i in range(freed.shape[0]):
        b = freed[i]
        mark = blk[b, MARK]
        ref = blk[b, REF] + (1 if mark & MARK_POPPED else 0)
        if b != 0 and (mark & (MARK_POPPED - 1)) > ref:
            code = ERR_DOUBLE_FREE
    for i in range(freed.shape[0]):
        blk[freed[i], MARK] = 0
    b = _next(blk, head)
    for _ in range(n):
        blk[b, MARK] = 0
        b = _next(blk, b)
    return code


def run_step(s, plan, freed, buf, lens, ratio, group, caching, events_on):
    """``kvpool.batch.step``: cache each item, allocate ``n`` blocks, free each table reversed.

    plan int64: ``[m, n, t]``, then per item ``num_cached, count, <count candidate ids>``
    (count >= 1), then the ``t`` table lengths; freed int64: the tables back to back, each in
    table order (released last entry first). buf/lens: one hash per candidate, in plan order.
    out int64 [>= n] receives the new ids. Every check of the composition runs first, each
    against the state the earlier parts leave; a failure returns ERR_BLOCK_ID, ERR_DUPLICATE,
    ERR_FREE_BLOCK, ERR_KEYED, ERR_NO_FREE or ERR_DOUBLE_FREE with nothing changed (which
    check failed first is for the caller to find). NEED_FULL: blocks to allocate while a
    watcher is pending. One EV_STORED per item (payload: the item's index).
    """
    (blk, blk64, ent, keys, key_bytes, table, meta, events, out, plan, freed, buf, lens) = (
        _raw(s.blk), _raw(s.blk64), _raw(s.ent), _raw(s.keys), _raw(s.key_bytes),
        _raw(s.table), _raw(s.meta),
        _raw(s.events), _raw(s.out), _raw(plan), _raw(freed), _raw(buf), _raw(lens))
    meta[M_EV_LEN] = 0
    meta[M_FIRED_LEN] = 0
    num_blocks = blk.shape[0] - 2
    size = plan.shape[0]
    if size < 3 or ratio < 1 or ratio > POSITION_LIMIT or group < 0 or group > 0xFFFFFFFF:
        return ERR_ARGUMENT
    m = plan[0]
    n = plan[1]
    t = plan[2]
    if m < 0 or n < 0 or t < 0 or (m > 0 and not caching):
        return ERR_ARGUMENT
    pos = 3
    total = 0
    for _ in range(m):
        if pos + 2 > size:
            return ERR_ARGUMENT
        c = plan[pos]
        count = plan[pos + 1]
        if c < 0 or c > POSITION_LIMIT or count < 1 or count > size - pos - 2:
            return ERR_ARGUMENT
        pos += 2 + count
        total += count
    if t != size - pos or total > STEP_LIMIT or freed.shape[0] > STEP_LIMIT:
        return ERR_ARGUMENT
    released = 0
    for j in range(t):
        if plan[pos + j] < 0:
            return ERR_ARGUMENT
        released += plan[pos + j]
    if released != freed.shape[0] or lens.shape[0] != total:
        return ERR_ARGUMENT
    longest = _hash_bytes_needed(buf, lens, total)
    if longest < 0:
        return ERR_ARGUMENT
    if n > meta[M_NUM_FREE]:
        return ERR_NO_FREE
    if n > out.shape[0]:
        return ERR_CAPACITY
    if n > 0 and meta[M_NUM_WATCHERS] > 0:
        return NEED_FULL
    item = 3
    for _ in range(m):
        count = plan[item + 1]
        for x in range(item + 2, item + 2 + count):
            if plan[x] < 0 or plan[x] >= num_blocks:
                return ERR_BLOCK_ID
        item += 2 + count
    if _first_bad_id(freed, num_blocks) >= 0:
        return ERR_BLOCK_ID
    code = _check_step_items(blk, blk64, plan, m, total, ratio) if m > 0 else OK
    if code == OK:
        code = _check_releases(blk, freed, n)
    if code != OK:
        return code
    if not _room_for(ent, keys, key_bytes, table, meta, events, total, longest, events_on):
        return ERR_CAPACITY
    # Removals: every entry live now or added by this call, at most once; one record per item.
    if events_on and events.shape[0] < meta[M_ENT_USED] + total + m:
        return ERR_CAPACITY
    item = 3
    g0 = 0
    off = 0
    for i in range(m):
        c = plan[item]
        count = plan[item + 1]
        _cache_candidates(blk, blk64, ent, keys, key_bytes, table, meta, events,
                          plan[item + 2 : item + 2 + count], buf[:0], buf[off:],
                          lens[g0 : g0 + count], c, ratio, group, False, events_on, i)
        for x in range(g0, g0 + count):
            off += lens[x]
        item += 2 + count
        g0 += count
    _pop_front(blk, blk64, ent, keys, table, meta, events, out, out[:0], n, caching, events_on)
    start = 0
    freed_count = 0
    for j in range(t):
        length = plan[pos + j]
        cursor = num_blocks  # each free_blocks call starts its front batch at the head
        for x in range(start + length - 1, start - 1, -1):
            b = freed[x]
            if b != 0:
                cursor = _release(blk, b, caching, cursor)
                if blk[b, REF] == 0:
                    freed_count += 1
        start += length
    meta[M_NUM_FREE] += freed_count
    return OK


def cache_partial_block(s, b, buf, units, group, replace, events_on):
    """Register the entry ``buf ‖ group`` covering ``units`` hbs-units, ending inside ``b``.

    The entry "grows": a shorter primary (or any key, with ``replace``) is removed first
    (EV_REMOVED each); the key then becomes the primary, or a secondary when a longer primary
    stays. One EV_PARTIAL when the pair is new. M_RESULT = 1 iff it was new. b is a valid
    non-null id (checked by the shell), buf uint8 [L] the hash, units >= 1.
    Errors: ERR_FREE_BLOCK (ref_cnt 0).
    """
    (blk, blk64, ent, keys, key_bytes, table, meta, events, buf) = (
        _raw(s.blk), _raw(s.blk64), _raw(s.ent), _raw(s.keys), _raw(s.key_bytes),
        _raw(s.table), _raw(s.meta),
        _raw(s.events), _raw(buf))
    meta[M_EV_LEN] = 0
    meta[M_RESULT] = 0
    n = blk.shape[0] - 2
    if b <= 0 or b >= n or units < 1 or group < 0 or group > 0xFFFFFFFF:
        return ERR_ARGUMENT
    if blk[b, REF] == 0:
        return ERR_FREE_BLOCK
    length = buf.shape[0]
    if not _room_for(ent, keys, key_bytes, table, meta, events, 1, length, events_on):
        return ERR_CAPACITY
    h = _hash_key(buf, 0, length, group)
    kid = _find_key(keys, key_bytes, table, buf, 0, length, group, h)
    already = kid != -1 and _block_has_key(blk, ent, b, kid)
    grows = not already and _first(blk, b) != -1 and blk64[b, TOKENS] < units
    if replace or grows:
        _remove_all_keys(blk, blk64, ent, keys, table, meta, events, b, events_on)
        already = False
        kid = _find_key(keys, key_bytes, table, buf, 0, length, group, h)
    if not already:
        if kid == -1:
            kid = _new_key(keys, key_bytes, table, meta, buf, 0, length, group, h)
        _add_entry(blk, blk64, ent, keys, meta, kid, b, units)
        if events_on:
            _emit(events, meta, EV_PARTIAL, b)
        meta[M_RESULT] = 1
    return OK


def move_block_hashes(blk, blk64, ent, keys, meta, src, dst):
    """Hand every key of ``src`` to ``dst``, in order; ``dst`` becomes the newest duplicate.

    Entries are relabelled and moved to the tail of their key chains — the same outcome as
    removing every pair of ``src`` and inserting it for ``dst``. No events. src, dst: valid,
    distinct, non-null ids (checked by the shell). Errors: ERR_DST_KEYED, ERR_FREE_BLOCK
    (M_ERR_INDEX 0 = src, 1 = dst).
    """
    blk, blk64, ent, keys, meta = _raw(blk), _raw(blk64), _raw(ent), _raw(keys), _raw(meta)
    n = blk.shape[0] - 2
    if src <= 0 or src >= n or dst <= 0 or dst >= n or src == dst:
        return ERR_ARGUMENT
    if _first(blk, dst) != -1:
        return ERR_DST_KEYED
    if blk[src, REF] == 0:
        meta[M_ERR_INDEX] = 0
        return ERR_FREE_BLOCK
    if blk[dst, REF] == 0:
        meta[M_ERR_INDEX] = 1
        return ERR_FREE_BLOCK
    e = _first(blk, src)
    _set_first(blk, dst, e)
    blk64[dst, TOKENS] = blk64[src, TOKENS]
    _set_first(blk, src, -1)
    blk64[src, TOKENS] = 0
    while e != -1:
        kid = ent[e, E_KEY]
        _unlink_from_key(ent, keys, e)
        _link_at_key_tail(ent, keys, kid, e, dst)
        e = ent[e, E_BNEXT]
    return OK


def evict_blocks(blk, blk64, ent, keys, table, meta, events, ids, events_on):
    """Drop every key of each listed block (EV_REMOVED each); refs, queue, watchers untouched.

    ids int64 [m]. Errors: ERR_BLOCK_ID (M_ERR_INDEX = position).
    """
    (blk, blk64, ent, keys, table, meta, events, ids) = (
        _raw(blk), _raw(blk64), _raw(ent), _raw(keys), _raw(table), _raw(meta), _raw(events),
        _raw(ids))
    meta[M_EV_LEN] = 0
    n = blk.shape[0] - 2
    bad = _first_bad_id(ids, n)
    if bad >= 0:
        meta[M_ERR_INDEX] = bad
        return ERR_BLOCK_ID
    if events_on and events.shape[0] < meta[M_ENT_USED] + 1:
        return ERR_CAPACITY
    for i in range(ids.shape[0]):
        _remove_all_keys(blk, blk64, ent, keys, table, meta, events, ids[i], events_on)
    return OK


def reset_prefix_cache(blk, blk64, ent, keys, table, meta, events, fired, events_on):
    """Forget every key and fire every watcher, if nothing but the null block is held.

    M_RESULT = 0 (blocks held: nothing changes) or 1. fired int64 [>= watchers] receives the
    watched blocks in watcher-table (stamp) order, count in M_FIRED_LEN; one EV_CLEARED.
    Queue order is kept. O(N + entries).
    """
    (blk, blk64, ent, keys, table, meta, events, fired) = (
        _raw(blk), _raw(blk64), _raw(ent), _raw(keys), _raw(table), _raw(meta), _raw(events),
        _raw(fired))
    meta[M_EV_LEN] = 0
    meta[M_FIRED_LEN] = 0
    meta[M_RESULT] = 0
    n = blk.shape[0] - 2
    if n - meta[M_NUM_FREE] != 1:
        return OK
    if fired.shape[0] < meta[M_NUM_WATCHERS] or (events_on and events.shape[0] < 1):
        return ERR_CAPACITY
    for e in range(meta[M_ENT_HIGH]):
        b = ent[e, E_BLOCK]
        if b >= 0:
            _set_first(blk, b, -1)
            blk64[b, TOKENS] = 0
    for i in range(table.shape[0]):
        table[i] = -1
    meta[M_ENT_USED] = 0
    meta[M_ENT_FREE] = -1
    meta[M_ENT_HIGH] = 0
    meta[M_KEY_USED] = 0
    meta[M_KEY_FREE] = -1
    meta[M_KEY_HIGH] = 0
    count = meta[M_NUM_WATCHERS]
    stamps = np.empty(count, dtype=np.int64)
    watched = np.empty(count, dtype=np.int64)
    w = 0
    for b in range(1, n):
        if blk64[b, WATCH] != 0 and w < count:
            stamps[w] = blk64[b, WATCH]
            watched[w] = b
            w += 1
            blk64[b, WATCH] = 0
    order = np.argsort(stamps[:w])
    for i in range(w):
        fired[i] = watched[order[i]]
    meta[M_NUM_WATCHERS] = 0
    meta[M_FIRED_LEN] = w
    if events_on:
        _emit(events, meta, EV_CLEARED, 0)
    meta[M_RESULT] = 1
    return OK


def block_is_writable(blk, b):
    """Not null, ref_cnt 1, no key. b must be a valid id (the shell checks)."""
    blk = _raw(blk)
    if b <= 0 or b >= blk.shape[0] - 2:
        return False
    return bool(blk[b, REF] == 1 and _first(blk, b) == -1)


def max_key_tokens(blk, blk64, ids):
    """The longest key, in hash blocks, among the blocks ``ids`` (0 when none has a key; the
    null block never has one): a request's table read in one call, as vLLM 0.33 estimates
    the tokens it found cached. ids int64 [m]. Returns ``-(i + 1)`` when ``ids[i]`` is not a
    block id (nothing read at or after it)."""
    blk, blk64, ids = _raw(blk), _raw(blk64), _raw(ids)
    n = blk.shape[0] - 2
    longest = 0
    for i in range(ids.shape[0]):
        b = ids[i]
        if b < 0 or b >= n:
            return -(i + 1)
        if _first(blk, b) != -1 and blk64[b, TOKENS] > longest:
            longest = int(blk64[b, TOKENS])  # an int, plain as compiled
    return longest


def queue_order(blk, out):
    """Write the queued blocks front to back into out int64 [>= free count]; returns count."""
    blk, out = _raw(blk), _raw(out)
    head = blk.shape[0] - 2
    tail = head + 1
    b = _next(blk, head)
    i = 0
    while b != tail and i < out.shape[0]:
        out[i] = b
        i += 1
        b = _next(blk, b)
    return i


# ===============================================================================================
# One-argument state: the one-op hot paths (h_*)
# ===============================================================================================


class PoolArrays:
    """Every array of one pool, and its two settings, in one object: the first argument ``s``
    of the one-op kernels (``h_*``) and of the batch kernels over the hash index.

    Numba converts each array argument of a call separately (40-80 ns each), so a one-op
    kernel over five arrays spends more on its arguments than on its work, and a batch kernel
    over nine pays about half a microsecond before it starts. :mod:`kvpool.fast.compiled`
    makes this a ``structref`` (one pointer to convert, and, unlike a jitclass, cached on
    disk with the kernels). Read-only for the kernels: the state builds a new one whenever
    it replaces an array (an array grows).
    """

    def __init__(self, blk, blk64, ent, keys, key_bytes, table, meta, events, out, caching,
                 events_on):
        self.blk = blk
        self.blk64 = blk64
        self.ent = ent
        self.keys = keys
        self.key_bytes = key_bytes
        self.table = table
        self.meta = meta
        self.events = events
        self.out = out
        self.caching = caching
        self.events_on = events_on


LOOKUP_BAD_GROUP = -2  # h_lookup_one: the group id is outside [0, 2**32): ask the shell


def h_lookup_one(s, block_hash, group):
    """:func:`lookup_one` over ``s``; ``LOOKUP_BAD_GROUP`` for a group outside [0, 2**32)."""
    if group < 0 or group > 0xFFFFFFFF:
        return LOOKUP_BAD_GROUP
    return lookup_one(s.keys, s.key_bytes, s.table, block_hash, group)


def h_touch_one(s, b):
    """:func:`touch_one` over ``s``."""
    return touch_one(s.blk, s.meta, b)


def h_free_one(s, b):
    """:func:`free_one` over ``s``."""
    return free_one(s.blk, s.meta, s.caching, b)


def h_pop(s, n):
    """The lean allocation over ``s``: :func:`get_new_blocks_unkeyed`, and when a popped
    block needs eviction on a pool without events or watchers, :func:`get_new_blocks_quiet`.
    Returns what they return (the first id, or ``-code``; ``-NEED_FULL``: use the full path)."""
    r = get_new_blocks_unkeyed(s.blk, s.meta, s.out, n)
    if r == -NEED_FULL and not s.events_on and s.meta[M_NUM_WATCHERS] == 0:
        r = get_new_blocks_quiet(s.blk, s.blk64, s.ent, s.keys, s.table, s.meta, s.out,
                                 s.caching, n)
    return r
