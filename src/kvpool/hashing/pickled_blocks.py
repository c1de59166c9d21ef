"""vLLM's block pickles written for a whole prompt at once: ``sha256`` and ``xxhash``, faster.

vLLM hashes each full block as ``digest(pickle.dumps((parent, tuple(tokens), None),
protocol=5))``. Per block that is a tuple built from a slice, a trip through the pickler
and a digest: most of a prompt's hashing time, and none of it is the digest. For a block
without extra keys the pickle is a fixed pattern, so this module writes every block's
pickle of a prompt into one buffer in one compiled pass over the packed tokens
(:func:`~kvpool.hashing.raw.pack_int32`, which the request made while checking them) and
leaves Python one step per block: put the parent digest into its slot, digest the record.
The bytes are exactly ``pickle.dumps``'s (a test compares them for every token range), so
the hashes are vLLM's. Measured on the kit trace's prompts (283k blocks): 0.95 s per-block
pickling against 0.58 s, nearly all of it now the SHA-256 calls themselves.

One block's pickle (protocol 5, the parent shorter than 256 bytes, at least 4 tokens)::

    80 05            PROTO 5
    95 <8 bytes>     FRAME: the length of everything after these 11 bytes
    43 <1 byte> ...  SHORT_BINBYTES: the parent's length, then the parent
    94               MEMOIZE (the parent)
    28               MARK
    per token:       4B <1 byte>      BININT1, for 0 <= t < 256
                     4D <2 bytes>     BININT2, for 256 <= t < 65536
                     4A <4 bytes>     BININT (signed), any other int32
    74 94            TUPLE, MEMOIZE (the tokens)
    4E 87 94 2E      NONE (no extra keys), TUPLE3, MEMOIZE, STOP

Anything else — a parent of 256 bytes or more, fewer than 4 tokens per block (pickle writes
TUPLE1..3 there), a block long enough for the pickler to split its frame — is declined
(``None``), and the caller hashes the tokens the ordinary way; so is every call where Numba
is not installed (the plain-Python writer would be slower than the pickler).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kvpool.hashing.functions import Digest
from kvpool.hashing.jit import bytes_type, entry_point

_FIXED = 21  # bytes of a record besides the parent and the tokens (header 15, trailer 6)
_MAX_RECORD = 60_000  # below the pickler's frame target (64 KiB): always one frame
_MIN_BLOCK = 4  # below it pickle writes TUPLE1..3 instead of MARK ... TUPLE


def write_records(tokens, num_blocks, block_size, first_parent_len, parent_len, buf, starts,
                  ends, slots):
    """Write the pickle of each of ``num_blocks`` blocks into ``buf``, back to back, every
    byte but the parent's; record ``i`` is ``buf[starts[i]:ends[i]]`` and its parent goes at
    ``slots[i]`` (``first_parent_len`` bytes for block 0, ``parent_len`` for the others).

    tokens: ``bytes``, little-endian int32 tokens (4 bytes each); buf: uint8 with room for
    ``num_blocks * (21 + max parent + 5 * block_size)`` bytes. Returns the bytes written.
    A token's width follows from its bytes: high half zero means 0 <= t < 65536.
    """
    pos = 0
    k = 0
    for i in range(num_blocks):
        plen = first_parent_len if i == 0 else parent_len
        start = pos
        buf[pos] = 0x80  # PROTO 5
        buf[pos + 1] = 5
        buf[pos + 2] = 0x95  # FRAME, its 8 length bytes written below
        buf[pos + 11] = 0x43  # SHORT_BINBYTES
        buf[pos + 12] = plen
        slots[i] = pos + 13
        pos += 13 + plen
        buf[pos] = 0x94  # MEMOIZE
        buf[pos + 1] = 0x28  # MARK
        pos += 2
        for _ in range(block_size):
            b0, b1, b2, b3 = tokens[k], tokens[k + 1], tokens[k + 2], tokens[k + 3]
            k += 4
            if b2 == 0 and b3 == 0:
                if b1 == 0:
                    buf[pos] = 0x4B  # BININT1
                    buf[pos + 1] = b0
                    pos += 2
                else:
                    buf[pos] = 0x4D  # BININT2
                    buf[pos + 1] = b0
                    buf[pos + 2] = b1
                    pos += 3
            else:
                buf[pos] = 0x4A  # BININT
                buf[pos + 1] = b0
                buf[pos + 2] = b1
                buf[pos + 3] = b2
                buf[pos + 4] = b3
                pos += 5
        buf[pos] = 0x74  # TUPLE
        buf[pos + 1] = 0x94  # MEMOIZE
        buf[pos + 2] = 0x4E  # NONE
        buf[pos + 3] = 0x87  # TUPLE3
        buf[pos + 4] = 0x94  # MEMOIZE
        buf[pos + 5] = 0x2E  # STOP
        pos += 6
        frame = pos - start - 11
        for b in range(8):
            buf[start + 3 + b] = (frame >> (8 * b)) & 255
        starts[i] = start
        ends[i] = pos
    return pos


_COMPILED: list[Any] = []  # [the compiled writer], or [None] without Numba; filled on first use


def _compiled_writer() -> Any:
    """:func:`write_records` as the entry point of the one signature :func:`block_pickles`
    calls it with (:mod:`kvpool.hashing.jit`), or ``None`` without Numba or under
    ``NUMBA_DISABLE_JIT`` (then the chain declines: the plain writer is slower than the
    pickler)."""
    if not _COMPILED:
        try:
            from numba import njit
            from numba import types as nt
        except ImportError:  # pragma: no cover - exercised where numba is absent
            _COMPILED.append(None)
        else:
            i64, index = nt.int64, nt.int64[::1]
            _COMPILED.append(entry_point(njit(cache=True)(write_records), (
                bytes_type(), i64, i64, i64, i64, nt.uint8[::1], index, index, index)))
    return _COMPILED[0]


def block_pickles(first_parent_len: int, parent_len: int, packed: bytes, block_size: int,
                  writer: Any = None) -> tuple[np.ndarray, list[int], list[int], list[int]] | None:
    """Every full block's pickle, parents left out: ``(buffer, starts, ends, parent slots)``
    as :func:`write_records` describes, or ``None`` for a shape outside the pattern (or no
    compiled ``writer`` to run: pass :func:`write_records` itself to run it uncompiled)."""
    writer = writer or _compiled_writer()
    longest_parent = max(first_parent_len, parent_len)
    if (writer is None or block_size < _MIN_BLOCK or not 0 <= first_parent_len < 256
            or not 0 <= parent_len < 256
            or _FIXED + longest_parent + 5 * block_size > _MAX_RECORD):
        return None
    num_blocks = len(packed) // (4 * block_size)
    buf = np.empty(max(1, num_blocks * (_FIXED + longest_parent + 5 * block_size)), np.uint8)
    index = np.empty((3, num_blocks), np.int64)
    writer(bytes(packed), num_blocks, block_size, first_parent_len, parent_len, buf, index[0],
           index[1], index[2])
    starts, ends, slots = index.tolist()
    return buf, starts, ends, slots


def pickled_packed_chain(digest: Digest, digest_size: int,
                         new_hash: Callable[[Any], Any] | None = None
                         ) -> Callable[[bytes, bytes, int], list[bytes] | None]:
    """A packed chain function for ``digest`` of vLLM's pickles: ``(parent, packed tokens,
    block_size) -> one hash per full block``, each equal to ``digest`` of the block's
    ``(parent, tuple(tokens), None)`` pickle, or ``None`` where :func:`block_pickles`
    declines. ``new_hash``, if given, is the hashlib constructor of ``digest``: calling it
    in the loop saves a Python call per block."""

    def chain(parent: bytes, packed: bytes, block_size: int) -> list[bytes] | None:
        if len(packed) < 4 * block_size:
            return []
        layout = block_pickles(len(parent), digest_size, packed, block_size)
        if layout is None:
            return None
        buf, starts, ends, slots = layout
        view = memoryview(buf)  # type: ignore[arg-type]  # numpy arrays are buffers
        hashes = []
        size = len(parent)  # then digest_size: a digest of another length fails the store
        if new_hash is not None:
            for start, end, slot in zip(starts, ends, slots, strict=True):
                view[slot : slot + size] = parent
                parent = new_hash(view[start:end]).digest()
                hashes.append(parent)
                size = digest_size
        else:
            for start, end, slot in zip(starts, ends, slots, strict=True):
                view[slot : slot + size] = parent
                parent = digest(view[start:end])  # type: ignore[arg-type]  # any buffer
                hashes.append(parent)
                size = digest_size
        return hashes

    return chain


__all__ = ["block_pickles", "pickled_packed_chain", "write_records"]
