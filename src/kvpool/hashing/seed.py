"""The seed NONE_HASH is derived from (BEHAVIOUR.md §2, vLLM 0.29+).

NONE_HASH is the parent of every request's first block, so two processes share prefix-cache
hashes only if they agree on it. Resolution order:

1. ``PYTHONHASHSEED`` is set → that string, for every algorithm (operators opt in to sharing).
2. The algorithm is cryptographic → the public constant ``"vllm-none-hash"``: SHA-256's
   collision resistance does not depend on a secret, so independent processes can share.
3. Otherwise (xxhash) → 32 random bytes as 64 hex characters, and a
   :class:`NonReproducibleHashWarning`: with a public seed an attacker could precompute
   colliding blocks offline, so the seed stays secret and hashes differ between processes.

This module is the only place that reads the environment for hashing, and only when the
caller does not pass ``environ`` explicitly; pass a seed to :class:`~kvpool.hashing.BlockHasher`
to skip resolution entirely.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
SEED_ENV_VAR = "PYTHONHASHSEED"
RANDOM_SEED_BYTES = 32


class NonReproducibleHashWarning(UserWarning):
    """Block hashes use a random per-process seed and will not match other processes."""


SeedSource = Literal["explicit", "env", "default", "random"]
"""Where a seed came from: passed by the caller, PYTHONHASHSEED, the constant, or os.urandom."""


@dataclass(frozen=True, slots=True)
class ResolvedSeed:
    """A NONE_HASH seed string and where it came from."""

    seed: str
    source: SeedSource


def resolve_seed(
    cryptographic: bool,
    environ: Mapping[str, str] | None = None,
    *,
    algorithm_name: str = "this hash algorithm",
) -> ResolvedSeed:
    """The NONE_HASH seed for an algorithm, per the order in the module docstring.

    ``environ`` defaults to :data:`os.environ`; pass a mapping to make resolution
    independent of the process environment. Warns :class:`NonReproducibleHashWarning` when
    it falls back to a random seed.
    """
    env = os.environ if environ is None else environ
    env_seed = env.get(SEED_ENV_VAR)
    if env_seed is not None:
        return ResolvedSeed(env_seed, "env")
    if cryptographic:
        return ResolvedSeed(DEFAULT_NONE_HASH_SEED, "default")
    warnings.warn(
        f"Using a random per-process NONE_HASH seed because {algorithm_name} is not "
        f"collision resistant; block hashes are not reproducible across processes. Set "
        f"{SEED_ENV_VAR} to a shared value to share the prefix cache, or use sha256.",
        NonReproducibleHashWarning,
        stacklevel=3,
    )
    return ResolvedSeed(os.urandom(RANDOM_SEED_BYTES).hex(), "random")


def resolve_none_hash_seed(
    cryptographic: bool,
    environ: Mapping[str, str] | None = None,
    *,
    algorithm_name: str = "this hash algorithm",
) -> str:
    """Just the seed string of :func:`resolve_seed` (vLLM's ``resolve_none_hash_seed``)."""
    return resolve_seed(cryptographic, environ, algorithm_name=algorithm_name).seed


__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "RANDOM_SEED_BYTES",
    "SEED_ENV_VAR",
    "NonReproducibleHashWarning",
    "ResolvedSeed",
    "SeedSource",
    "resolve_none_hash_seed",
    "resolve_seed",
]
