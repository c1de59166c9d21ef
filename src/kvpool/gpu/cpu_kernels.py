"""The GPU layer's CPU kernels, compiled with Numba (``cache=True``: a fresh process loads
machine code instead of compiling). Every setting is an argument: a cached function never
reads a module global that could change after it was compiled.

* :func:`slot_mapping` — token → KV slot through a block table, every index checked;
* :func:`plan_copies` — a whole copy (or swap) batch in one pass: every rule of
  :mod:`kvpool.gpu.copy_plan` checked in order, runs of consecutive ids merged, and the
  segments (one per run, layer and K/V) the copy kernel walks;
* :func:`copy_segments` — a batch of block runs inside or between flat KV buffers.

Why a kernel for copies: torch's ``index_copy_`` and per-block ``copy_`` reach a fraction of
memory bandwidth on blocks of tens of KiB (per-call overhead, and stores that first read the
destination line), and so does libc ``memcpy`` called per block (measured: 50–70 % of
``np.copyto``): below its non-temporal threshold it stores through the cache, so every
destination line is first read (read-for-ownership). :func:`copy_segments` walks every
segment of the step in one call and stores whole 64-byte lines with *non-temporal* hints
(``vmovntdq``): the destination is never read, which is what lets ``np.copyto``'s glibc
``memcpy`` reach full bandwidth on large copies. It copies ``lanes`` segments at a time,
interleaved in ``chunk``-byte steps: random blocks are short independent streams, and
several in flight keep more memory requests outstanding than one (glibc's large copies
interleave pages for the same reason); measured +5–20 % over one segment at a time.
Segments not 64-byte aligned take a 32-, 16-byte or word loop, one at a time.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types as nt
from numba.extending import intrinsic

OK = -1

# slot_mapping error codes (the index of the offending token goes with them)
BAD_ROW = 1
BAD_POSITION = 2
BEYOND_TABLE = 3
BAD_BLOCK = 4
NULL_BLOCK = 5

# plan_copies outcomes (info[0]); info[1] is the pair the rule failed on
BAD_GROUP = 11
BAD_SOURCE = 12
BAD_DESTINATION = 13
NULL_PAIR = 14
DESTINATION_TWICE = 15  # info[2]: the pair that named it first
DESTINATION_IS_SOURCE = 16
DESTINATION_SHARED = 17  # info[2]: its ref count; info[3]: this batch's retentions of it
BAD_PLAN_INPUT = 18  # the planner's own arrays disagree: a caller's bug, not the batch's

# plan_copies refs_mode: where rule 4's ref counts come from
NO_REFS = 0  # rule 4 is not checked
REFS_BY_BLOCK = 1  # refs[block_id], e.g. a live view of the pool's ref counts
REFS_BY_PAIR = 2  # refs[i]: pairs[i]'s destination, e.g. what a ref_cnts callback returned
IDS_ONLY = 3  # stop after rules 1-3 (the ids a callback may be asked about are valid)

# copy_segments' settings (passed as arguments by its callers): 8 segments in flight, 256
# bytes (4 lines) of each in turn — the best of 1/2/4/8/16 lanes x 64/256 bytes measured
# with benchmarks/gpu_copy.py on 4 KiB..1 MiB blocks
COPY_LANES = 8
COPY_CHUNK = 256

RADIX_BITS = 11  # the coalescing sort: 2^11 counters per pass, keys of 22 bits in two passes


def _streamer(width: int):
    """An intrinsic copying ``width`` bytes from address ``src`` to ``dst`` as one vector,
    stored non-temporally (both addresses must be ``width``-aligned)."""

    @intrinsic
    def stream(typingctx, dst, src):
        sig = nt.void(nt.intp, nt.intp)

        def codegen(context, builder, signature, args):
            d, s = args
            vec = ir.VectorType(ir.IntType(64), width // 8)
            value = builder.load(builder.inttoptr(s, vec.as_pointer()), align=width)
            store = builder.store(value, builder.inttoptr(d, vec.as_pointer()), align=width)
            store.set_metadata("nontemporal",
                               builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
            return context.get_dummy_value()

        return sig, codegen

    return stream


_stream64 = _streamer(64)  # one cache line: AVX-512 where the CPU has it, else split by LLVM
_stream32 = _streamer(32)
_stream16 = _streamer(16)


@intrinsic
def _store_fence(typingctx):
    """Order the streamed stores before anything after the call (``sfence``-strength)."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return nt.void(), codegen


@numba.njit(nt.int64(nt.int32[:, ::1], nt.int32[::1], nt.int32[::1], nt.int64[::1],
                     nt.int64, nt.int64, nt.int64[::1], nt.int64[::1]),
            cache=True, nogil=True)
def slot_mapping(table, lengths, rows, positions, block_size, num_blocks, out, error):
    """``out[t] = table[rows[t], positions[t] // bs] * bs + positions[t] % bs``.

    Position ``-1`` is padding (slot ``-1``). Returns :data:`OK` or the first bad token's
    index with its code in ``error[0]``; nothing outside the arrays is read either way.
    """
    num_rows = table.shape[0]
    for t in range(rows.shape[0]):
        r = rows[t]
        p = positions[t]
        if r < 0 or r >= num_rows:
            error[0] = BAD_ROW
            return t
        if p == -1:
            out[t] = -1
            continue
        if p < 0:
            error[0] = BAD_POSITION
            return t
        j = p // block_size
        if j >= lengths[r] or j >= table.shape[1]:
            error[0] = BEYOND_TABLE
            return t
        b = table[r, j]
        if b < 0 or b >= num_blocks:
            error[0] = BAD_BLOCK
            return t
        if b == 0:
            error[0] = NULL_BLOCK
            return t
        out[t] = b * block_size + p % block_size
    return OK


# -- the copy planner -----------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _fail(info, code, index, a, b):
    info[0] = code
    info[1] = index
    info[2] = a
    info[3] = b
    return False


@numba.njit(cache=True, nogil=True)
def _check_ids(pairs, num_groups, src_blocks, dst_blocks, same_space, null_dst, info):
    """Rules 1 and 2: ids in range (group, then source, then destination of the first bad
    pair), then the null block (the first pair naming it, once every id is in range)."""
    src_null = same_space or not null_dst  # a host source side has no null block
    first_null = -1
    for i in range(pairs.shape[0]):
        s, d, g = pairs[i, 0], pairs[i, 1], pairs[i, 2]
        if g < 0 or g >= num_groups:
            return _fail(info, BAD_GROUP, i, 0, 0)
        if s < 0 or s >= src_blocks:
            return _fail(info, BAD_SOURCE, i, 0, 0)
        if d < 0 or d >= dst_blocks:
            return _fail(info, BAD_DESTINATION, i, 0, 0)
        if first_null < 0 and ((s == 0 and src_null) or (d == 0 and null_dst)):
            first_null = i
    if first_null >= 0:
        return _fail(info, NULL_PAIR, first_null, 0, 0)
    return True


@numba.njit(cache=True, nogil=True)
def _check_destinations(pairs, same_space, marks, info):
    """Rule 3 (ids already in range): each destination named once — the first pair naming a
    destination again fails — and, in one id space, never also a source (the first such
    destination's pair fails). ``marks`` (zero, one entry per destination id) is zero again
    on return."""
    n = pairs.shape[0]
    twice = -1
    for i in range(n):
        d = pairs[i, 1]
        if marks[d] != 0:
            twice = i
            break
        marks[d] = i + 1
    first = -1 if twice < 0 else marks[pairs[twice, 1]] - 1
    is_source = n
    if twice < 0 and same_space:
        for j in range(n):
            s = pairs[j, 0]
            if s < marks.shape[0] and marks[s] != 0:
                is_source = min(is_source, marks[s] - 1)
    for i in range(n if twice < 0 else twice):
        marks[pairs[i, 1]] = 0
    if twice >= 0:
        return _fail(info, DESTINATION_TWICE, twice, first, 0)
    if is_source < n:
        return _fail(info, DESTINATION_IS_SOURCE, is_source, 0, 0)
    return True


@numba.njit(cache=True, nogil=True)
def _check_shared(pairs, refs_mode, refs, retained, marks, info):
    """Rule 4: a destination's holders less this batch's retentions of it are at most one.
    ``marks`` counts the retentions (ids outside the destination side name no destination)
    and is zero again on return."""
    n = pairs.shape[0]
    if refs_mode == REFS_BY_PAIR and refs.shape[0] != n:
        return _fail(info, BAD_PLAN_INPUT, -1, refs.shape[0], n)
    if refs_mode == REFS_BY_BLOCK and refs.shape[0] < marks.shape[0]:
        return _fail(info, BAD_PLAN_INPUT, -1, refs.shape[0], marks.shape[0])
    for r in range(retained.shape[0]):
        b = retained[r]
        if 0 <= b < marks.shape[0]:
            marks[b] += 1
    bad, ref, held = -1, 0, 0
    for i in range(n):
        d = pairs[i, 1]
        ref = refs[d] if refs_mode == REFS_BY_BLOCK else refs[i]
        held = marks[d]
        if ref > held + 1:  # holders less retentions > 1, without overflow (held <= n)
            bad = i
            break
    for r in range(retained.shape[0]):
        b = retained[r]
        if 0 <= b < marks.shape[0]:
            marks[b] = 0
    if bad >= 0:
        return _fail(info, DESTINATION_SHARED, bad, ref, held)
    return True


@numba.njit(cache=True, nogil=True)
def _radix_order(key, key_bits, radix_bits):
    """The stable order of ``key`` (non-negative, below ``2**key_bits``): LSD radix sort,
    O(n) per ``radix_bits`` of key; an already sorted key costs one scan."""
    n = key.shape[0]
    order = np.arange(n)
    ordered = True
    for i in range(1, n):
        if key[i] < key[i - 1]:
            ordered = False
            break
    if ordered or key_bits <= 0:
        return order
    # As few passes as radix_bits allows, each as narrow as they can be (fewer counters)
    passes = (key_bits + radix_bits - 1) // radix_bits
    digit_bits = (key_bits + passes - 1) // passes
    spare = np.empty(n, np.int64)
    counts = np.empty(1 << digit_bits, np.int64)
    mask = (1 << digit_bits) - 1
    shift = 0
    while shift < key_bits:
        counts[:] = 0
        for i in range(n):
            counts[(key[order[i]] >> shift) & mask] += 1
        total = 0
        for c in range(counts.shape[0]):
            count = counts[c]
            counts[c] = total
            total += count
        for i in range(n):
            digit = (key[order[i]] >> shift) & mask
            spare[counts[digit]] = order[i]
            counts[digit] += 1
        order, spare = spare, order
        shift += digit_bits
    return order


@numba.njit(cache=True, nogil=True)
def _coalesce(pairs, src_blocks, radix_bits):
    """Runs ``[m, 4]`` of ``(group, src_start, dst_start, length)``: pairs in (group, source)
    order — stable, so equal sources keep the batch's order — merged while the group stays
    and both ids advance by one. Ids must be in range (rule 1)."""
    n = pairs.shape[0]
    key = np.empty(n, np.int64)
    top = 1
    for i in range(n):
        key[i] = pairs[i, 2] * src_blocks + pairs[i, 0]
        top = max(top, key[i] + 1)
    bits = 0
    while (1 << bits) < top:
        bits += 1
    order = _radix_order(key, bits, radix_bits)
    runs = np.empty((n, 4), np.int64)
    m = 0
    for k in range(n):
        p = order[k]
        s, d, g = pairs[p, 0], pairs[p, 1], pairs[p, 2]
        if m and runs[m - 1, 0] == g and runs[m - 1, 1] + runs[m - 1, 3] == s and \
                runs[m - 1, 2] + runs[m - 1, 3] == d:
            runs[m - 1, 3] += 1
        else:
            runs[m, 0], runs[m, 1], runs[m, 2], runs[m, 3] = g, s, d, 1
            m += 1
    return runs[:m]


@numba.njit(cache=True, nogil=True)
def _run_segments(runs, src_bases, dst_bases, base_start, words):
    """``[k, 3]`` ``(src_word, dst_word, num_words)``: per run (in order) one segment per
    base of its group — every layer's K and V; a group with no bases (Mamba) has none."""
    total = 0
    for r in range(runs.shape[0]):
        g = runs[r, 0]
        total += base_start[g + 1] - base_start[g]
    out = np.empty((total, 3), np.int64)
    k = 0
    for r in range(runs.shape[0]):
        g, s, d, n = runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3]
        w = words[g]
        for b in range(base_start[g], base_start[g + 1]):
            out[k, 0] = src_bases[b] + s * w
            out[k, 1] = dst_bases[b] + d * w
            out[k, 2] = n * w
            k += 1
    return out


@numba.njit(cache=True, nogil=True)
def plan_copies(pairs, num_groups, src_blocks, dst_blocks, same_space, null_dst, refs_mode,
                refs, retained, marks, src_bases, dst_bases, base_start, words, radix_bits,
                info):
    """Check a batch of ``(src, dst, group)`` rows against every rule, in order, then plan
    it: the segments ``[k, 3]`` of ``(src_word, dst_word, num_words)`` for
    :func:`copy_segments`.

    ``info[0]`` is :data:`OK` (then ``info[1]`` is the number of runs) or the first rule
    that failed, with the pair's index in ``info[1]`` and the rule's numbers after it; a
    failed batch plans nothing. ``marks``: a zero scratch array, one entry per destination
    id, zero again on return. ``refs``/``refs_mode``: rule 4's ref counts
    (:data:`NO_REFS`, :data:`REFS_BY_BLOCK`, :data:`REFS_BY_PAIR`; :data:`IDS_ONLY`
    stops after rule 3). ``src_bases``/``dst_bases``: word offsets of block 0 per layer and
    K/V, group ``g``'s in ``[base_start[g], base_start[g+1])``; ``words[g]`` per block.
    O(n) in the batch (the coalescing sort is a radix sort), whatever the pool's size;
    nothing outside the given arrays is read or written, whatever the rows hold.
    """
    info[0], info[1], info[2], info[3] = OK, 0, 0, 0
    if pairs.shape[1] != 3 or base_start.shape[0] != num_groups + 1 or \
            words.shape[0] != num_groups or marks.shape[0] < dst_blocks or \
            src_bases.shape[0] != dst_bases.shape[0] or radix_bits < 1 or \
            (src_blocks > 0 and num_groups > (1 << 62) // src_blocks):
        _fail(info, BAD_PLAN_INPUT, -1, 0, 0)
        return np.zeros((0, 3), np.int64)
    for g in range(num_groups):
        if base_start[g] < 0 or base_start[g] > base_start[g + 1] or \
                base_start[g + 1] > src_bases.shape[0]:
            _fail(info, BAD_PLAN_INPUT, -1, g, 0)
            return np.zeros((0, 3), np.int64)
    if not _check_ids(pairs, num_groups, src_blocks, dst_blocks, same_space, null_dst, info):
        return np.zeros((0, 3), np.int64)
    if not _check_destinations(pairs, same_space, marks, info):
        return np.zeros((0, 3), np.int64)
    if refs_mode == IDS_ONLY:
        return np.zeros((0, 3), np.int64)
    if refs_mode != NO_REFS and \
            not _check_shared(pairs, refs_mode, refs, retained, marks, info):
        return np.zeros((0, 3), np.int64)
    runs = _coalesce(pairs, src_blocks, radix_bits)
    info[1] = runs.shape[0]
    return _run_segments(runs, src_bases, dst_bases, base_start, words)


@numba.njit(nt.int64[:, ::1](nt.int64[:, ::1], nt.int64, nt.int64), cache=True, nogil=True)
def coalesce_runs(pairs, src_blocks, radix_bits):
    """:func:`plan_copies`'s merging step alone (ids must be in ``[0, src_blocks)``)."""
    return _coalesce(pairs, src_blocks, radix_bits)


@numba.njit(cache=True, nogil=True)
def run_segments(runs, src_bases, dst_bases, base_start, words):
    """:func:`plan_copies`'s segment step alone."""
    return _run_segments(runs, src_bases, dst_bases, base_start, words)


# -- the copy kernel -------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _copy_one(src, dst, sa, da, s, d, n, word_bytes):
    """One segment: the widest vector both addresses and the length are aligned to (torch's
    CPU allocations are 64-byte aligned, and so are blocks of 64-byte multiples)."""
    nbytes = n * word_bytes
    aligned = sa | da | nbytes
    if aligned % 64 == 0:
        for i in range(nbytes // 64):
            _stream64(da + 64 * i, sa + 64 * i)
    elif aligned % 32 == 0:
        for i in range(nbytes // 32):
            _stream32(da + 32 * i, sa + 32 * i)
    elif aligned % 16 == 0:
        for i in range(nbytes // 16):
            _stream16(da + 16 * i, sa + 16 * i)
    else:
        for i in range(n):
            dst[d + i] = src[s + i]


def _copy_segments_impl(src, dst, segments, word_bytes, lanes, chunk):
    # Bounds first: a bad segment copies nothing (the planner already checked; this is the
    # kernel's own guard, so no caller's ids can make it touch memory outside the buffers).
    # Written so that no sum can overflow: n <= size, then s <= size - n.
    n_src = src.shape[0]
    n_dst = dst.shape[0]
    num = segments.shape[0]
    if segments.shape[1] != 3:
        return 0
    for k in range(num):
        s, d, n = segments[k, 0], segments[k, 1], segments[k, 2]
        if s < 0 or d < 0 or n < 0 or n > n_src or n > n_dst or s > n_src - n or \
                d > n_dst - n:
            return k
    lanes = min(max(lanes, 1), 64)
    if chunk < 64 or chunk % 64:
        chunk = 64
    src_base = src.ctypes.data
    dst_base = dst.ctypes.data
    sa = np.empty(lanes, np.int64)
    da = np.empty(lanes, np.int64)
    k = 0
    while k < num:
        # `lanes` segments at once when all are whole 64-byte lines: `chunk` bytes of each in
        # turn up to the shortest's length, then each one's rest.
        group = lanes > 1 and k + lanes <= num
        shortest = 0
        if group:
            shortest = segments[k, 2] * word_bytes
            for j in range(lanes):
                sa[j] = src_base + segments[k + j, 0] * word_bytes
                da[j] = dst_base + segments[k + j, 1] * word_bytes
                nbytes = segments[k + j, 2] * word_bytes
                shortest = min(shortest, nbytes)
                if (sa[j] | da[j] | nbytes) % 64:
                    group = False
                    break
        if not group:
            s, d, n = segments[k, 0], segments[k, 1], segments[k, 2]
            _copy_one(src, dst, src_base + s * word_bytes, dst_base + d * word_bytes, s, d, n,
                      word_bytes)
            k += 1
            continue
        done = shortest - shortest % chunk
        for off in range(0, done, chunk):
            for j in range(lanes):
                for c in range(off, off + chunk, 64):
                    _stream64(da[j] + c, sa[j] + c)
        for j in range(lanes):
            for c in range(done, segments[k + j, 2] * word_bytes, 64):
                _stream64(da[j] + c, sa[j] + c)
        k += lanes
    _store_fence()
    return OK


_WORD_TYPES = (nt.int64, nt.int32, nt.int16, nt.uint8)
_copy_segments = numba.njit(
    [nt.int64(nt.Array(w, 1, "C"), nt.Array(w, 1, "C"), nt.int64[:, ::1], nt.int64, nt.int64,
              nt.int64)
     for w in _WORD_TYPES], cache=True, nogil=True)(_copy_segments_impl)


def copy_segments(src, dst, segments, word_bytes: int, lanes: int = COPY_LANES,
                  chunk: int = COPY_CHUNK) -> int:
    """``dst[d:d+n] = src[s:s+n]`` for every row ``(s, d, n)`` of ``segments`` (in words of
    ``word_bytes``), ``lanes`` segments interleaved in ``chunk``-byte steps; ``src`` may be
    ``dst`` (segments must not overlap: the planner's rule 3). Returns :data:`OK`, or the
    index of the first segment outside a buffer, having copied nothing."""
    return _copy_segments(src, dst, segments, word_bytes, lanes, chunk)


__all__ = ["OK", "coalesce_runs", "copy_segments", "plan_copies", "run_segments",
           "slot_mapping"]
