"""Hash algorithms by name: what each serialises, how it digests, what it promises.

The four vLLM names (``sha256``, ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``) reproduce vLLM's
bytes exactly. The ``*_raw`` names are kvpool's faster, vLLM-incompatible mode
(:mod:`kvpool.hashing.raw`); ``kvhash_raw`` hashes a whole prompt in one native call
(:mod:`kvpool.hashing.native`, non-cryptographic: read its collision properties). Looking a
name up resolves its digest immediately, so a missing xxhash package fails at configuration
time rather than at the first block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from kvpool.errors import InvalidConfig
from kvpool.hashing.functions import (
    HashFunction,
    cbor_hash,
    load_xxh3_128_digest,
    pickled_hash,
    sha256,
    sha256_cbor,
    sha256_digest,
)
from kvpool.hashing.pickled_blocks import pickled_packed_chain
from kvpool.hashing.raw import ChainFunction, PackedChainFunction, raw_chain, raw_hash

DEFAULT_HASH_ALGORITHM = "sha256"


@dataclass(frozen=True, slots=True)
class HashAlgorithm:
    """A named hash function and the properties callers must know about it.

    ``cryptographic`` decides the default NONE_HASH seed (§2): collision-resistant
    algorithms may use a fixed, public seed; the others need a secret, random one.
    ``chain``, when present, hashes many consecutive blocks in one call and must return
    exactly what per-block hashing of ``(parent, tuple(tokens), extra_keys)`` returns;
    ``packed_chain`` does the same for tokens packed by
    :func:`~kvpool.hashing.raw.pack_int32` and no extra keys (the raw modes, whose encoding
    is that packing, and the pickled ones, which write vLLM's pickles from it:
    :mod:`kvpool.hashing.pickled_blocks`), or returns ``None`` to decline a shape it does
    not cover (the caller then passes the tokens).
    """

    name: str
    hash_fn: HashFunction
    digest_size: int
    cryptographic: bool
    vllm_compatible: bool
    chain: ChainFunction | None = None
    packed_chain: PackedChainFunction | None = None


def _sha256() -> HashAlgorithm:
    return HashAlgorithm("sha256", sha256, 32, cryptographic=True, vllm_compatible=True,
                         packed_chain=pickled_packed_chain(sha256_digest, 32, hashlib.sha256))


def _sha256_cbor() -> HashAlgorithm:
    return HashAlgorithm("sha256_cbor", sha256_cbor, 32, cryptographic=True, vllm_compatible=True)


def _xxhash() -> HashAlgorithm:
    digest = load_xxh3_128_digest()
    return HashAlgorithm(
        "xxhash", pickled_hash(digest), 16, cryptographic=False, vllm_compatible=True,
        packed_chain=pickled_packed_chain(digest, 16),
    )


def _xxhash_cbor() -> HashAlgorithm:
    digest = load_xxh3_128_digest()
    return HashAlgorithm(
        "xxhash_cbor", cbor_hash(digest), 16, cryptographic=False, vllm_compatible=True
    )


def _sha256_raw() -> HashAlgorithm:
    chain, packed_chain = raw_chain(sha256_digest, 32, new_hash=hashlib.sha256)
    return HashAlgorithm(
        "sha256_raw",
        raw_hash(sha256_digest),
        32,
        cryptographic=True,
        vllm_compatible=False,
        chain=chain,
        packed_chain=packed_chain,
    )


def _xxhash_raw() -> HashAlgorithm:
    digest = load_xxh3_128_digest()
    chain, packed_chain = raw_chain(digest, 16)
    return HashAlgorithm(
        "xxhash_raw",
        raw_hash(digest),
        16,
        cryptographic=False,
        vllm_compatible=False,
        chain=chain,
        packed_chain=packed_chain,
    )


def _kvhash_raw() -> HashAlgorithm:
    from kvpool.hashing.native import DIGEST_SIZE, kvhash, kvhash_chain, kvhash_chain_packed

    return HashAlgorithm(
        "kvhash_raw",
        kvhash,
        DIGEST_SIZE,
        cryptographic=False,
        vllm_compatible=False,
        chain=kvhash_chain,
        packed_chain=kvhash_chain_packed,
    )


_FACTORIES: dict[str, Callable[[], HashAlgorithm]] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
    "sha256_raw": _sha256_raw,
    "xxhash_raw": _xxhash_raw,
    "kvhash_raw": _kvhash_raw,
}

HASH_ALGORITHM_NAMES: tuple[str, ...] = tuple(_FACTORIES)
"""Every name :func:`get_hash_algorithm` accepts, vLLM's four first."""

VLLM_HASH_ALGORITHM_NAMES: tuple[str, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def get_hash_algorithm(name: str) -> HashAlgorithm:
    """The algorithm called ``name``.

    Raises :class:`InvalidConfig` (a ``ValueError``) ``"Unsupported hash function: <name>"``
    for unknown names, and :class:`ModuleNotFoundError` for xxhash names without xxhash.
    """
    factory = _FACTORIES.get(name) if isinstance(name, str) else None
    if factory is None:
        raise InvalidConfig(f"Unsupported hash function: {name}")
    return factory()


def get_hash_fn_by_name(name: str) -> HashFunction:
    """The bare hash function called ``name`` (vLLM's ``get_hash_fn_by_name``)."""
    return get_hash_algorithm(name).hash_fn


def available_hash_algorithms() -> tuple[str, ...]:
    """The names whose dependencies are installed, in :data:`HASH_ALGORITHM_NAMES` order."""
    names = []
    for name in HASH_ALGORITHM_NAMES:
        try:
            get_hash_algorithm(name)
        except ModuleNotFoundError:
            continue
        names.append(name)
    return tuple(names)


__all__ = [
    "DEFAULT_HASH_ALGORITHM",
    "HASH_ALGORITHM_NAMES",
    "VLLM_HASH_ALGORITHM_NAMES",
    "HashAlgorithm",
    "available_hash_algorithms",
    "get_hash_algorithm",
    "get_hash_fn_by_name",
]
