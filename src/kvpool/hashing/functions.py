"""vLLM-compatible hash functions: serialise an object, digest the bytes (BEHAVIOUR.md §2).

==============  =======================================  ===============
name            serialisation                            digest
==============  =======================================  ===============
``sha256``      ``pickle.dumps(obj, protocol=5)``        SHA-256, 32 B
``sha256_cbor`` ``cbor2.dumps(obj, canonical=True)``     SHA-256, 32 B
``xxhash``      ``pickle.dumps(obj, protocol=5)``        xxh3-128, 16 B
``xxhash_cbor`` ``cbor2.dumps(obj, canonical=True)``     xxh3-128, 16 B
==============  =======================================  ===============

Compatibility with vLLM is byte-for-byte only when the *same Python object* is hashed: a tuple
of ``bytes``, a tuple of Python ``int`` and ``None`` or a tuple of extra keys. Pickle encodes
types, so a list instead of a tuple, or numpy integers instead of ``int``, give other digests.
Protocol 5 is pinned rather than read from ``pickle.HIGHEST_PROTOCOL`` so a future Python
cannot silently change every hash.

``xxhash`` is an optional dependency; it is imported when an xxhash function is first
needed, and its absence raises :class:`ModuleNotFoundError` with installation advice.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any

import cbor2

PICKLE_PROTOCOL = 5

XXHASH_MISSING_MESSAGE = (
    "xxhash is required for the 'xxhash' prefix caching hash algorithms. "
    "Install it with `pip install xxhash`."
)

Digest = Callable[[bytes], bytes]
"""Digest of a byte string."""

HashFunction = Callable[[Any], bytes]
"""vLLM's notion of a hash function: any object in, digest bytes out."""


def sha256_digest(data: bytes) -> bytes:
    """SHA-256 of ``data`` (32 bytes)."""
    return hashlib.sha256(data).digest()


def load_xxh3_128_digest() -> Digest:
    """``xxhash.xxh3_128_digest``, or :class:`ModuleNotFoundError` naming the fix."""
    try:
        import xxhash as xxhash_module
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(XXHASH_MISSING_MESSAGE) from exc
    digest: Digest = xxhash_module.xxh3_128_digest
    return digest


def pickle_bytes(obj: Any) -> bytes:
    """``obj`` pickled with protocol 5, the serialisation of ``sha256`` and ``xxhash``."""
    return pickle.dumps(obj, protocol=PICKLE_PROTOCOL)


def cbor_bytes(obj: Any) -> bytes:
    """``obj`` as canonical CBOR (tuples become arrays), the serialisation of the ``*_cbor``s."""
    return cbor2.dumps(obj, canonical=True)


def sha256(obj: Any) -> bytes:
    """SHA-256 of ``obj`` pickled with protocol 5 (vLLM's default ``sha256``)."""
    return hashlib.sha256(pickle.dumps(obj, protocol=PICKLE_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 of ``obj`` as canonical CBOR: reproducible outside Python."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash(obj: Any) -> bytes:
    """xxh3-128 of ``obj`` pickled with protocol 5 (16 bytes; not collision resistant)."""
    return load_xxh3_128_digest()(pickle.dumps(obj, protocol=PICKLE_PROTOCOL))


def xxhash_cbor(obj: Any) -> bytes:
    """xxh3-128 of ``obj`` as canonical CBOR (16 bytes; not collision resistant)."""
    return load_xxh3_128_digest()(cbor2.dumps(obj, canonical=True))


def pickled_hash(digest: Digest) -> HashFunction:
    """The hash function ``obj -> digest(pickle protocol 5 of obj)``.

    Binds the digest once, at configuration time, instead of importing xxhash on every call
    as the module-level :func:`xxhash` does; the body is inlined because it runs per block.
    """

    def hash_function(obj: Any) -> bytes:
        return digest(pickle.dumps(obj, protocol=PICKLE_PROTOCOL))

    return hash_function


def cbor_hash(digest: Digest) -> HashFunction:
    """The hash function ``obj -> digest(canonical CBOR of obj)``."""

    def hash_function(obj: Any) -> bytes:
        return digest(cbor2.dumps(obj, canonical=True))

    return hash_function


__all__ = [
    "PICKLE_PROTOCOL",
    "XXHASH_MISSING_MESSAGE",
    "Digest",
    "HashFunction",
    "cbor_bytes",
    "cbor_hash",
    "load_xxh3_128_digest",
    "pickle_bytes",
    "pickled_hash",
    "sha256",
    "sha256_cbor",
    "sha256_digest",
    "xxhash",
    "xxhash_cbor",
]
