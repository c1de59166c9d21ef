"""Requests whose block hashes collide on purpose: a small alphabet and shared prefixes.

Prefix caching only gets interesting when different requests produce equal block hashes:
hits, shared blocks, several blocks under one key. The harness therefore builds prompts from
a three-token alphabet, usually starting with one of a few fixed prefixes, and hashes them
with a fixed seed so that every process (and every pasted reproduction) sees the same hashes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import LoRARequest, MultiModalFeature, Request

HASH_SEED = "kvpool-harness"
"""NONE_HASH seed of every harness request: reproducible across processes."""

TOKEN_ALPHABET = (1, 2, 3)

SHARED_PREFIXES: tuple[tuple[int, ...], ...] = (
    (),
    (1, 1, 2, 2, 1, 1),
    (1, 1, 2, 2, 1, 1, 3, 3, 3, 1, 2, 3),
    (2, 3, 2, 3),
)
"""Prompt openings several requests share, so their leading block hashes are equal."""

REQUEST_EXTRAS: tuple[dict[str, Any], ...] = (
    {},
    {"lora_request": LoRARequest("adapter-a", 7, "/adapters/a")},
    {"mm_features": [MultiModalFeature("image-0", 2, 3)]},
    {"cache_salt": "tenant-1"},
    {
        "lora_request": LoRARequest("adapter-b", 9, "/adapters/b"),
        "mm_features": [MultiModalFeature("image-1", 1, 2), MultiModalFeature("image-2", 5, 4)],
        "cache_salt": "tenant-2",
    },
)
"""Extra-key inputs a harness request may carry, by index (``make_request(..., extras=i)``):
none, a LoRA adapter, a multimodal item across a block boundary, a cache salt, all three.
They change the block hashes and every ``BlockStored`` event's ``lora_id``, ``lora_name``
and ``extra_keys``, which a pool under test must report from the request."""

_HASHER = BlockHasher("sha256", seed=HASH_SEED)
_BLOCK_HASHERS: dict[tuple[int, int], object] = {}


def make_request(
    token_ids: Iterable[int],
    *,
    hash_block_size: int,
    request_id: str = "r",
    num_hash_lookahead_tokens: int = 0,
    extras: int = 0,
) -> Request:
    """A request over ``token_ids`` with ``block_hashes`` computed (sha256, fixed seed),
    carrying the extra-key inputs ``REQUEST_EXTRAS[extras]``. ``token_ids`` may be a numpy
    integer array: the request turns its entries into Python ints."""
    key = (hash_block_size, num_hash_lookahead_tokens)
    hasher = _BLOCK_HASHERS.get(key)
    if hasher is None:
        hasher = get_request_block_hasher(hash_block_size, _HASHER, num_hash_lookahead_tokens)
        _BLOCK_HASHERS[key] = hasher
    return Request(request_id, list(token_ids), block_hasher=hasher,  # type: ignore[arg-type]
                   **REQUEST_EXTRAS[extras])


def coarse_hashes(request: Request, hash_block_size: int, block_size: int) -> list[bytes]:
    """The request's hashes at ``block_size`` granularity: the last fine hash of each block."""
    ratio = block_size // hash_block_size
    fine = request.block_hashes
    return [fine[(i + 1) * ratio - 1] for i in range(len(fine) // ratio)]


__all__ = [
    "HASH_SEED",
    "REQUEST_EXTRAS",
    "SHARED_PREFIXES",
    "TOKEN_ALPHABET",
    "coarse_hashes",
    "make_request",
]
