"""The GPU layer's CPU kernels, compiled with Numba (``cache=True``: a fresh process loads
machine code instead of compiling).

* :func:`slot_mapping` — token → KV slot through a block table, every index checked;
* :func:`copy_segments` — a batch of block runs inside or between flat KV buffers.

Why a kernel for copies: torch's ``index_copy_`` and per-block ``copy_`` reach a fraction of
memory bandwidth on blocks of tens of KiB (per-call overhead, and stores that first read the
destination line). :func:`copy_segments` walks every segment of the step in one call and
stores the widest aligned vectors (64, 32 or 16 bytes) with *non-temporal* hints
(``vmovntdq``): the destination is not read first, which is what lets ``np.copyto``'s glibc
``memcpy`` reach full bandwidth on large copies. Segments not 16-byte aligned fall back to a
word loop.
"""

from __future__ import annotations

import numba
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


def _copy_segments_impl(src, dst, segments, word_bytes):
    # Bounds first: a bad segment copies nothing (the planner already checked; this is the
    # kernel's own guard, so no caller's ids can make it touch memory outside the buffers).
    n_src = src.shape[0]
    n_dst = dst.shape[0]
    for k in range(segments.shape[0]):
        s, d, n = segments[k, 0], segments[k, 1], segments[k, 2]
        if s < 0 or d < 0 or n < 0 or s + n > n_src or d + n > n_dst:
            return k
    src_base = src.ctypes.data
    dst_base = dst.ctypes.data
    for k in range(segments.shape[0]):
        s, d, n = segments[k, 0], segments[k, 1], segments[k, 2]
        sa = src_base + s * word_bytes
        da = dst_base + d * word_bytes
        nbytes = n * word_bytes
        # The widest vector both addresses and the length are aligned to (torch's CPU
        # allocations are 64-byte aligned, and so are blocks of 64-byte multiples).
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
    _store_fence()
    return OK


_WORD_TYPES = (nt.int64, nt.int32, nt.int16, nt.uint8)
copy_segments = numba.njit(
    [nt.int64(nt.Array(w, 1, "C"), nt.Array(w, 1, "C"), nt.int64[:, ::1], nt.int64)
     for w in _WORD_TYPES], cache=True, nogil=True)(_copy_segments_impl)
"""``dst[d:d+n] = src[s:s+n]`` for every row ``(s, d, n)`` of ``segments`` (in words of
``word_bytes``); ``src`` may be ``dst``. Returns :data:`OK`, or the index of the first
segment outside a buffer, having copied nothing."""


__all__ = ["OK", "copy_segments", "slot_mapping"]
