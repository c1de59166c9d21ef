"""``kvhash_raw``: a whole prompt's chained block hashes in one native call (**not vLLM's**).

The raw modes of :mod:`kvpool.hashing.raw` still pay one digest call (and one Python
expression) per block. ``kvhash_raw`` hashes every full block of a token list in a single
compiled call: the tokens are packed once into little-endian int32 bytes (one C-level
conversion, as in :func:`~kvpool.hashing.raw.raw_chain`), then the kernel builds each block's
canonical raw encoding ``encode_raw((parent, tokens, None))`` in a scratch buffer and digests
it, feeding each digest in as the next block's parent — the chain never leaves native code.

**The digest.** 128 bits out (16 bytes, ``digest_size`` 16), of which 126 carry information:
two 63-bit multiply–xorshift lanes over the encoding in 7-byte little-endian words, mixed
into each other at every word, each lane finished with a 63-bit avalanche step. Every step
is masked to 63 bits, so the compiled kernel (wrapping int64) and the plain-Python run of the
same source (unbounded ints) give the same bytes, and the mode works without Numba (slowly).

**Collision properties — read before using it.** The function is *not* cryptographic:
anyone who can choose token ids can construct two different prefixes with the same hash,
and thereby make one request's prefix-cache lookup return another request's KV blocks
(cross-request cache poisoning). Use it only where every prompt comes from a trusted source
or the pool is not shared between tenants; otherwise use ``sha256`` (vLLM's default) or
``sha256_raw``. For inputs not chosen adversarially it behaves like a random function of
126 bits as far as the tests can tell, so the chance that any two of ``n`` distinct blocks
collide is about ``n**2 / 2**127`` (10**12 blocks: ~10**-14). Its NONE_HASH needs a secret
seed, like every non-cryptographic algorithm (BEHAVIOUR.md §2); the seed only keeps offline
collision search against a deployment impractical, it does not make collisions hard.

Hashes never equal vLLM's nor those of the other kvpool modes. Blocks with extra keys
(LoRA, multimodal, salt, prompt embeddings), tokens outside int32 and a parent longer than
the scratch buffer expects take the per-block path, which encodes each block on its own and
digests it with the same kernel: same bytes, slower.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvpool.hashing.jit import bytes_type, entry_point
from kvpool.hashing.raw import encode_raw, pack_int32

DIGEST_SIZE = 16
_DIGEST_ROW = np.dtype(f"V{DIGEST_SIZE}")
_M63 = 0x7FFFFFFFFFFFFFFF
_SEED_A = 0x1F83D9ABFB41BD6B
_SEED_B = 0x5BE0CD19137E2179
_P1 = 0x2127599BF4325C37
_P2 = 0x4CF5AD432745937F
_C1 = 0x7FB5D329728EA185
_C2 = 0x41C64E6DA3BC0074 | 1


def _mul63(x, c):
    """The low 63 bits of ``x * c`` (plain Python; the compiled twin is registered below)."""
    return (x * c) & _M63


def _add63(x, y):
    """The low 63 bits of ``x + y`` (plain Python; compiled twin below)."""
    return (x + y) & _M63


def _avalanche(x):
    x ^= x >> 33
    x = _mul63(x, _C1)
    x ^= x >> 29
    x = _mul63(x, _C2)
    return x ^ (x >> 32)


def _word7(buf, i):
    """Bytes ``buf[i:i+7]`` as a little-endian int, written out in full: compiled, the seven
    loads and shifts become two or three wide loads (a loop over a variable count did not,
    and cost about three times as much per block). The leading ``0 |`` types it int64 when
    compiled (the bytes alone would make it uint64, which does not unify with int64)."""
    return (0 | int(buf[i]) | (int(buf[i + 1]) << 8) | (int(buf[i + 2]) << 16)
            | (int(buf[i + 3]) << 24) | (int(buf[i + 4]) << 32) | (int(buf[i + 5]) << 40)
            | (int(buf[i + 6]) << 48))


def _digest_into(buf, end, out, row):
    """Digest ``buf[:end]`` into ``out[row, :16]`` (two 8-byte little-endian lanes)."""
    a = _SEED_A ^ end
    b = _SEED_B ^ end
    i = 0
    while i < end:
        if i + 7 <= end:
            word = _word7(buf, i)
        else:  # the last, shorter word
            word = 0
            for j in range(i, end):
                word |= int(buf[j]) << (8 * (j - i))
        a = _mul63(a ^ word, _P1)
        a ^= a >> 29
        b = _mul63(b ^ word, _P2)
        b ^= b >> 31
        b = _add63(b, a)
        i += 7
    h1 = _avalanche(_add63(a, b))
    h2 = _avalanche(b ^ h1)
    for k in range(8):
        out[row, k] = (h1 >> (8 * k)) & 255
        out[row, 8 + k] = (h2 >> (8 * k)) & 255


def _put_u32(buf, at, value):
    for k in range(4):
        buf[at + k] = (value >> (8 * k)) & 255


def digest_bytes(buf, out):
    """The digest of all of ``buf`` (``bytes`` or uint8) into ``out`` (uint8 [1, 16])."""
    _digest_into(buf, len(buf), out, 0)
    return 0


def chain_blocks(parent, packed, block_size, num_blocks, scratch, out):
    """Hash ``num_blocks`` chained blocks: ``out[i]`` = digest of ``encode_raw((parent_i,
    tokens_i, None))`` with ``parent_0 = parent`` and ``parent_i = out[i - 1]``.

    parent, packed: ``bytes`` (or uint8 arrays), ``packed`` the blocks' tokens as
    little-endian int32 (``4 * block_size`` bytes per block); scratch: uint8, at least
    ``20 + max(len(parent), 16) + 4 * block_size`` bytes.
    """
    width = 4 * block_size
    for i in range(num_blocks):
        scratch[0] = 116  # "t": a tuple of 3
        _put_u32(scratch, 1, 3)
        scratch[5] = 98  # "b": the parent's bytes
        if i == 0:
            length = len(parent)
            for k in range(length):
                scratch[10 + k] = parent[k]
        else:
            length = 16
            for k in range(16):
                scratch[10 + k] = out[i - 1, k]
        _put_u32(scratch, 6, length)
        p = 10 + length
        scratch[p] = 105  # "i": int32 tokens
        _put_u32(scratch, p + 1, block_size)
        p += 5
        base = i * width
        for k in range(width):
            scratch[p + k] = packed[base + k]
        p += width
        scratch[p] = 78  # "N": no extra keys
        _digest_into(scratch, p + 1, out, i)
    return 0


try:  # compiled when Numba is installed; the same source runs as plain Python otherwise
    from numba import njit
    from numba.extending import overload, register_jitable

    @overload(_mul63)
    def _mul63_compiled(x, c):
        # In unsigned arithmetic: a signed product may be assumed not to overflow by the
        # optimiser, which then drops the mask (observed: compiled and plain bytes differed).
        def mul63(x, c):
            return np.int64(np.uint64(x) * np.uint64(c) & np.uint64(_M63))

        return mul63

    @overload(_add63)
    def _add63_compiled(x, y):
        def add63(x, y):
            return np.int64(np.uint64(x) + np.uint64(y) & np.uint64(_M63))

        return add63

    from numba import types as _nt

    for _helper in (_avalanche, _word7, _digest_into, _put_u32):
        register_jitable(_helper)
    digest_bytes = njit(cache=True)(digest_bytes)
    chain_blocks = njit(cache=True)(chain_blocks)
    _BYTES = bytes_type()
    _SIGNATURES: dict[str, tuple] = {
        "digest_bytes": (_BYTES, _nt.uint8[:, ::1]),
        "chain_blocks": (_BYTES, _BYTES, _nt.int64, _nt.int64, _nt.uint8[::1],
                         _nt.uint8[:, ::1]),
    }
except ImportError:  # pragma: no cover - exercised where numba is absent
    _SIGNATURES = {}

_ENTRY_POINTS: dict[str, Any] = {}


def _entry(name: str) -> Any:
    """The kernel ``name`` as the entry point of the one signature the wrappers below call it
    with (:mod:`kvpool.hashing.jit`), or the plain function without Numba."""
    entry = _ENTRY_POINTS.get(name)
    if entry is None:
        kernel = globals()[name]
        entry = (entry_point(kernel, _SIGNATURES[name]) if name in _SIGNATURES else None) \
            or kernel
        _ENTRY_POINTS[name] = entry
    return entry


def kvhash(obj: Any) -> bytes:
    """``digest(encode_raw(obj))``: the per-object hash function of ``kvhash_raw``."""
    out = np.empty((1, DIGEST_SIZE), np.uint8)
    _entry("digest_bytes")(encode_raw(obj), out)
    return out.tobytes()


def kvhash_chain(parent: bytes, tokens: Sequence[int], block_size: int,
                 extra_keys: Sequence[Any] | None) -> list[bytes]:
    """Every full block's chained hash, equal to :func:`kvhash` of each block's 3-tuple."""
    num_blocks = len(tokens) // block_size
    if num_blocks == 0:
        return []
    packed = None
    if extra_keys is None or all(key is None for key in extra_keys):
        try:
            packed = pack_int32(tokens[: num_blocks * block_size])
        except (OverflowError, TypeError):
            packed = None
    if packed is None:
        return _per_block(parent, tokens, block_size, extra_keys)
    return kvhash_chain_packed(parent, packed, block_size)


def kvhash_chain_packed(parent: bytes, packed: bytes, block_size: int) -> list[bytes]:
    """:func:`kvhash_chain` of tokens packed already (:func:`~kvpool.hashing.raw.pack_int32`),
    no extra keys."""
    num_blocks = len(packed) // (4 * block_size)
    if num_blocks == 0:
        return []
    out = np.empty((num_blocks, DIGEST_SIZE), np.uint8)
    scratch = np.empty(26 + max(len(parent), DIGEST_SIZE) + 4 * block_size, np.uint8)
    _entry("chain_blocks")(bytes(parent), bytes(packed), block_size, num_blocks, scratch, out)
    # One bytes object per row, made in C: ~5x faster than slicing the row bytes in Python.
    # "V" (raw void), not "S": an "S" item drops its trailing zero bytes.
    return out.view(_DIGEST_ROW).reshape(-1).tolist()


def _per_block(parent: bytes, tokens: Sequence[int], block_size: int,
               extra_keys: Sequence[Any] | None) -> list[bytes]:
    hashes: list[bytes] = []
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        extra = None if extra_keys is None else extra_keys[i]
        parent = kvhash((parent, block, extra))
        hashes.append(parent)
    return hashes


__all__ = ["DIGEST_SIZE", "kvhash", "kvhash_chain", "kvhash_chain_packed"]
