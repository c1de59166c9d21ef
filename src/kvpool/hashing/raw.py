"""Raw-bytes hashing: a faster mode that is **not compatible with vLLM**.

vLLM hashes a pickled ``(parent, tokens, extra_keys)`` tuple. Building that tuple and pickling
it costs about as much as a SHA-256 digest and far more than an xxh3 one, so the raw modes
(``sha256_raw``, ``xxhash_raw``) hash a small canonical binary encoding instead, in which the
token ids of all new blocks are packed as little-endian integers in one C-level call. Expect
a modest gain (see ``benchmarks/bench_hashing.py``), not an order of magnitude: the chain is
serial, so one digest call per block remains. Hashes from these modes never match vLLM's and
never match the pickled modes; use them only where every producer and consumer of hashes is
kvpool.

Encoding ("kvpool raw v1"; integers in length fields are 4-byte little-endian unsigned):

==========================  ============================================================
value                       bytes
==========================  ============================================================
``None``                    ``N``
``bool``                    ``?`` then ``00`` or ``01``
``int`` in int64 range      ``q`` then 8 bytes little-endian two's complement
other ``int``               ``Z`` then length, then minimal little-endian two's complement
``float``                   ``d`` then 8 bytes IEEE-754 little-endian
``bytes``-like              ``b`` then length, then the bytes
``str``                     ``s`` then length, then UTF-8
tuple/list of int32s        ``i`` then count, then 4 bytes per element, little-endian
tuple/list of int64s        ``l`` then count, then 8 bytes per element, little-endian
other tuple/list            ``t`` then count, then each element's encoding
==========================  ============================================================

The encoding is canonical: each value has exactly one encoding (tuples and lists encode
alike, and inside an all-integer sequence ``True``/``False`` encode as 1/0, which Python
already treats as equal). A sequence uses the narrowest integer form that holds all its
elements, so whole-request packing (:func:`raw_chain`) and per-block encoding agree.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from kvpool.hashing.functions import Digest

RAW_FORMAT_VERSION = 1

# array typecodes with exactly 4 and 8 bytes per item on this platform.
_INT32 = next(code for code in "ilh" if array(code).itemsize == 4)
_INT64 = "q"
# The same widths in struct's standard sizes, little-endian whatever the platform.
_STRUCT_FORMAT = {_INT32: "<%di", _INT64: "<%dq"}
_BIG_ENDIAN = sys.byteorder == "big"
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

ChainFunction = Callable[[bytes, Sequence[int], int, Sequence[Any] | None], list[bytes]]
"""``(parent, tokens, block_size, extra_keys per block or None) -> one hash per full block``."""

PackedChainFunction = Callable[[bytes, bytes, int], "list[bytes] | None"]
"""``(parent, tokens packed by pack_int32, block_size) -> one hash per full block``, no extra
keys: what a :data:`ChainFunction` returns for the same tokens, minus their packing; or
``None`` where the function declines the shape (the caller then hashes the tokens)."""


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "little")


def _pack_ints(typecode: str, values: Sequence[int]) -> bytes:
    """``values`` as little-endian fixed-width ints; OverflowError/TypeError if they do not fit.

    ``array`` defines what packs (any object with ``__index__``, in range) and which error a
    value that does not gets; ``struct`` packs exactly the same values about twice as fast
    (``array`` parses a format string per item: ~40 against ~19 ns per token, measured on a
    prompt list), so it goes first and ``array`` runs only to type its error.
    """
    try:
        return struct.pack(_STRUCT_FORMAT[typecode] % len(values), *values)
    except struct.error:  # a value out of range or not an integer: the typed error
        packed = array(typecode, values)
        if _BIG_ENDIAN:
            packed.byteswap()
        return packed.tobytes()


def pack_int32(values: Sequence[int]) -> bytes:
    """Token ids as the raw encoding stores a sequence of them: little-endian int32, one
    C-level pass. Raises ``OverflowError`` for an id outside int32 (and ``TypeError`` for a
    value that is not an int); callers then take the per-block path."""
    return _pack_ints(_INT32, values)


def _encode_sequence(values: Sequence[Any]) -> bytes:
    try:
        return b"i" + _u32(len(values)) + pack_int32(values)
    except (OverflowError, TypeError):
        pass
    try:
        return b"l" + _u32(len(values)) + _pack_ints(_INT64, values)
    except (OverflowError, TypeError):
        pass
    return b"t" + _u32(len(values)) + b"".join(encode_raw(item) for item in values)


def encode_raw(obj: Any) -> bytes:
    """The canonical raw encoding of ``obj`` (see the module docstring).

    Raises :class:`TypeError` for values outside the table (dicts, sets, arbitrary objects).
    """
    if obj is None:
        return b"N"
    if isinstance(obj, bool):
        return b"?\x01" if obj else b"?\x00"
    if isinstance(obj, int):
        if _INT64_MIN <= obj <= _INT64_MAX:
            return b"q" + obj.to_bytes(8, "little", signed=True)
        size = (obj.bit_length() + 8) // 8
        return b"Z" + _u32(size) + obj.to_bytes(size, "little", signed=True)
    if isinstance(obj, float):
        return b"d" + struct.pack("<d", obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        return b"b" + _u32(len(data)) + data
    if isinstance(obj, str):
        data = obj.encode("utf-8")
        return b"s" + _u32(len(data)) + data
    if isinstance(obj, (tuple, list)):
        return _encode_sequence(obj)
    raise TypeError(f"raw hashing cannot encode a value of type {type(obj).__name__}")


def raw_hash(digest: Digest) -> Callable[[Any], bytes]:
    """The hash function ``obj -> digest(encode_raw(obj))``."""

    def hash_function(obj: Any) -> bytes:
        return digest(encode_raw(obj))

    return hash_function


# encode_raw((parent, tokens, extra)) starts with a 3-tuple header and the parent's tag.
_BLOCK_PREFIX = b"t" + _u32(3) + b"b"


def raw_chain(
    digest: Digest,
    digest_size: int,
    *,
    new_hash: Callable[[bytes], Any] | None = None,
) -> tuple[ChainFunction, PackedChainFunction]:
    """Hash consecutive full blocks in one pass; equal to hashing each block's 3-tuple.

    The token ids of all blocks are packed once (one C-level conversion, :func:`pack_int32`)
    instead of being put in a tuple and pickled once per block; the second function returned
    takes tokens packed already (a request packs its prompt while validating it). If any
    token does not fit in 32 bits the whole-sequence packing fails and every block is
    encoded on its own instead, so each block keeps its canonical per-block encoding.
    ``new_hash`` (e.g. ``hashlib.sha256``) may stand in for ``digest`` as
    ``new_hash(data).digest()``, which saves a Python call per block when the digest has no
    one-call C function. ``parent`` must be truthy (the caller substitutes NONE_HASH).
    """
    digest_prefix = _BLOCK_PREFIX + _u32(digest_size)

    def chain(
        parent: bytes,
        tokens: Sequence[int],
        block_size: int,
        extra_keys: Sequence[Any] | None,
    ) -> list[bytes]:
        num_blocks = len(tokens) // block_size
        if num_blocks == 0:
            return []
        try:
            packed = pack_int32(tokens[: num_blocks * block_size])
        except (OverflowError, TypeError):
            return _chain_per_block(digest, parent, tokens, block_size, extra_keys)
        return chain_packed(parent, packed, block_size, extra_keys)

    def chain_packed(
        parent: bytes,
        packed: bytes,
        block_size: int,
        extra_keys: Sequence[Any] | None = None,
    ) -> list[bytes]:
        num_blocks = len(packed) // (4 * block_size)
        if num_blocks == 0:
            return []
        width = 4 * block_size
        tokens_header = b"i" + _u32(block_size)
        # Everything after the parent is known up front. Building it first leaves the serial
        # part (each hash feeds the next) as one comprehension: a concatenation and a digest.
        if extra_keys is None:
            bodies = [
                tokens_header + packed[offset : offset + width] + b"N"
                for offset in range(0, num_blocks * width, width)
            ]
        else:
            bodies = [
                tokens_header + packed[i * width : (i + 1) * width] + encode_raw(extra_keys[i])
                for i in range(num_blocks)
            ]
        # Digests all have digest_size bytes; only the caller-supplied parent may not.
        previous = digest(_BLOCK_PREFIX + _u32(len(parent)) + parent + bodies[0])
        hashes = [previous]
        if new_hash is not None:
            hashes += [
                previous := new_hash(digest_prefix + previous + body).digest()
                for body in bodies[1:]
            ]
        else:
            hashes += [previous := digest(digest_prefix + previous + body) for body in bodies[1:]]
        return hashes

    return chain, chain_packed


def _chain_per_block(
    digest: Digest,
    parent: bytes,
    tokens: Sequence[int],
    block_size: int,
    extra_keys: Sequence[Any] | None,
) -> list[bytes]:
    """The slow path of :func:`raw_chain`: encode every block's 3-tuple on its own."""
    hashes: list[bytes] = []
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        extra = None if extra_keys is None else extra_keys[i]
        parent = digest(encode_raw((parent, block, extra)))
        hashes.append(parent)
    return hashes


__all__ = [
    "RAW_FORMAT_VERSION",
    "ChainFunction",
    "PackedChainFunction",
    "encode_raw",
    "pack_int32",
    "raw_chain",
    "raw_hash",
]
