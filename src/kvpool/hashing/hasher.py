"""A hash algorithm bound to its own NONE_HASH, and the chained block hash (BEHAVIOUR.md §2).

vLLM keeps NONE_HASH in a module global set by ``init_none_hash``, so one process can only
use one algorithm and one seed. A :class:`BlockHasher` holds its own: two hashers with
different algorithms or seeds coexist, and tests build hashers without touching globals.

The chained hash of a block is ``hash_fn((parent, tuple(tokens), extra_keys))``, with a falsy
parent (``None`` or ``b""``) replaced by the hasher's NONE_HASH. Block ``i``'s hash thus
covers every token before it, which is what makes "a miss at ``i`` implies a miss at every
``j > i``" true for the hash list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvpool.errors import InvalidArgument, InvalidConfig
from kvpool.hashing.algorithms import DEFAULT_HASH_ALGORITHM, HashAlgorithm, get_hash_algorithm
from kvpool.hashing.functions import HashFunction
from kvpool.hashing.seed import ResolvedSeed, SeedSource, resolve_seed


class BlockHasher:
    """A hash algorithm, the seed it was given and the NONE_HASH derived from it.

    ``BlockHasher("sha256")`` resolves the seed from the environment (see
    :func:`~kvpool.hashing.seed.resolve_seed`); ``BlockHasher("xxhash", seed="s")``
    skips resolution. ``none_hash`` is ``hash_fn(seed)``: the seed *string* goes through the
    same serialiser and digest as blocks do. Calling the hasher hashes any object, so it can
    stand wherever vLLM expects a hash function.

    Attributes:
        algorithm: the :class:`HashAlgorithm` in use.
        seed: the resolved seed string (readable back, e.g. to hand to another process).
        seed_source: ``"explicit"`` (passed in), ``"env"`` (PYTHONHASHSEED), ``"default"``
            (the public constant) or ``"random"`` (not reproducible across processes).
        none_hash: the parent hash of every first block.
    """

    __slots__ = ("_hash_fn", "algorithm", "none_hash", "seed", "seed_source")

    algorithm: HashAlgorithm
    seed: str
    seed_source: SeedSource
    none_hash: bytes

    def __init__(
        self,
        algorithm: str | HashAlgorithm = DEFAULT_HASH_ALGORITHM,
        seed: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(algorithm, HashAlgorithm):
            algorithm = get_hash_algorithm(algorithm)
        if seed is None:
            resolved = resolve_seed(algorithm.cryptographic, environ, algorithm_name=algorithm.name)
        elif isinstance(seed, str):
            resolved = ResolvedSeed(seed, "explicit")
        else:
            raise InvalidConfig(f"NONE_HASH seed must be a str, got {type(seed).__name__}")
        self.algorithm = algorithm
        self._hash_fn = algorithm.hash_fn
        self.seed = resolved.seed
        self.seed_source = resolved.source
        self.none_hash = algorithm.hash_fn(resolved.seed)

    @property
    def name(self) -> str:
        """The algorithm's name, e.g. ``"sha256"``."""
        return self.algorithm.name

    @property
    def reproducible(self) -> bool:
        """Whether another process can derive the same NONE_HASH (the seed is not random)."""
        return self.seed_source != "random"

    @property
    def hash_fn(self) -> HashFunction:
        """The bare hash function (object in, digest out)."""
        return self._hash_fn

    def __call__(self, obj: Any) -> bytes:
        """Digest of ``obj`` under this hasher's algorithm."""
        return self._hash_fn(obj)

    def __repr__(self) -> str:
        # The seed is deliberately left out: for xxhash it is the secret that keeps
        # offline collision search impractical.
        return f"BlockHasher({self.name!r}, none_hash={self.none_hash.hex()[:16]}...)"

    def hash_block_tokens(
        self,
        parent_block_hash: bytes | None,
        curr_block_token_ids: Sequence[int],
        extra_keys: Any = None,
    ) -> bytes:
        """Hash of one block: ``hash_fn((parent or NONE_HASH, tuple(tokens), extra_keys))``.

        No memoisation (vLLM's docstring mentions an LRU cache that does not exist).
        """
        if not parent_block_hash:
            parent_block_hash = self.none_hash
        return self._hash_fn((parent_block_hash, tuple(curr_block_token_ids), extra_keys))

    def hash_blocks(
        self,
        parent_block_hash: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        extra_keys: Sequence[Any] | None = None,
    ) -> list[bytes]:
        """Chained hashes of every full ``block_size`` block of ``token_ids``, in order.

        Equal to calling :meth:`hash_block_tokens` block by block, feeding each hash in as
        the next parent; a trailing partial block is ignored. ``extra_keys`` holds one entry
        per full block, or is ``None`` when no block has extra keys. Algorithms with a
        multi-block fast path (the raw modes) use it here. O(len(token_ids)).
        """
        if not isinstance(block_size, int) or block_size <= 0:
            raise InvalidArgument(f"block_size must be a positive int, got {block_size!r}")
        num_blocks = len(token_ids) // block_size
        if extra_keys is not None and len(extra_keys) != num_blocks:
            raise InvalidArgument(
                f"extra_keys has {len(extra_keys)} entries for {num_blocks} full blocks"
            )
        parent = parent_block_hash or self.none_hash
        if self.algorithm.chain is not None:
            return self.algorithm.chain(parent, token_ids, block_size, extra_keys)
        return self._hash_per_block(parent, token_ids, block_size, num_blocks, extra_keys)

    def hash_packed_blocks(self, parent_block_hash: bytes | None, packed: bytes,
                           block_size: int) -> list[bytes] | None:
        """:meth:`hash_blocks` of tokens packed by :func:`~kvpool.hashing.raw.pack_int32`,
        without extra keys, or ``None`` when the algorithm cannot hash from that packing
        (the CBOR ones; the pickled ones for a shape :mod:`kvpool.hashing.pickled_blocks`
        declines): the caller then passes the tokens.
        A request packs its prompt while validating it, so the raw modes skip a second
        pass over the tokens. O(len(packed)). Raises :class:`InvalidArgument` for a
        ``block_size`` that is not a positive int or ``packed`` that is not ``bytes``."""
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
            raise InvalidArgument(f"block_size must be a positive int, got {block_size!r}")
        if type(packed) is not bytes:
            raise InvalidArgument(
                f"packed tokens must be bytes (pack_int32), got {type(packed).__name__}")
        packed_chain = self.algorithm.packed_chain
        if packed_chain is None:
            return None
        return packed_chain(parent_block_hash or self.none_hash, packed, block_size)

    def _hash_per_block(self, parent: bytes, token_ids: Sequence[int], block_size: int,
                        num_blocks: int, extra_keys: Sequence[Any] | None) -> list[bytes]:
        hash_fn = self._hash_fn
        hashes: list[bytes] = []
        for i in range(num_blocks):
            block = tuple(token_ids[i * block_size : (i + 1) * block_size])
            parent = hash_fn((parent, block, None if extra_keys is None else extra_keys[i]))
            hashes.append(parent)
        return hashes


def hash_block_tokens(
    hasher: BlockHasher,
    parent_block_hash: bytes | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: Any = None,
) -> bytes:
    """vLLM's ``hash_block_tokens`` with the hasher (and its NONE_HASH) passed explicitly."""
    return hasher.hash_block_tokens(parent_block_hash, curr_block_token_ids, extra_keys)


__all__ = ["BlockHasher", "hash_block_tokens"]
