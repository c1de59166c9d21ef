"""Block hashing for the prefix cache (BEHAVIOUR.md §1, §2, §7).

A block's hash covers its tokens, every token before it (hashes are chained) and its *extra
keys* (LoRA adapter, multimodal items, cache salt, prompt embeddings). With the four vLLM
algorithm names the bytes equal vLLM's; the ``*_raw`` names are a faster kvpool-only mode.

Modules, one concern each:

* :mod:`~kvpool.hashing.functions` – vLLM's hash functions (serialise, then digest);
* :mod:`~kvpool.hashing.raw` – the vLLM-incompatible raw-bytes encoding;
* :mod:`~kvpool.hashing.pickled_blocks` – vLLM's block pickles written for a whole packed
  prompt at once (``sha256``/``xxhash`` from the packing a request makes anyway);
* :mod:`~kvpool.hashing.native` – ``kvhash_raw``: a whole prompt's chain in one native call;
* :mod:`~kvpool.hashing.jit` – the compiled entry points those two call;
* :mod:`~kvpool.hashing.algorithms` – lookup by name;
* :mod:`~kvpool.hashing.seed` – the NONE_HASH seed (the only environment read);
* :mod:`~kvpool.hashing.hasher` – :class:`BlockHasher`, an algorithm with its own NONE_HASH;
* :mod:`~kvpool.hashing.extra_keys` – tagged keys for hashing, untagged ones for events;
* :mod:`~kvpool.hashing.request_hasher` – incremental hashing of a request's full blocks;
* :mod:`~kvpool.hashing.coarse` – hashes at a group's larger block size;
* :mod:`~kvpool.hashing.bench` – throughput measurement (not imported here).

>>> from kvpool.request import Request
>>> hasher = BlockHasher("sha256", seed="vllm-none-hash")
>>> request = Request("r", list(range(40)), block_hasher=get_request_block_hasher(16, hasher))
>>> len(request.block_hashes)  # two full blocks of 16; the last 8 tokens wait
2
"""

from kvpool.hashing.algorithms import (
    DEFAULT_HASH_ALGORITHM,
    HASH_ALGORITHM_NAMES,
    VLLM_HASH_ALGORITHM_NAMES,
    HashAlgorithm,
    available_hash_algorithms,
    get_hash_algorithm,
    get_hash_fn_by_name,
)
from kvpool.hashing.coarse import CoarseBlockHashes, resolve_block_hashes
from kvpool.hashing.extra_keys import (
    event_extra_keys,
    generate_block_hash_extra_keys,
    lookahead_token_ids,
    mm_start_index,
    need_extra_keys,
    untag_extra_key,
)
from kvpool.hashing.functions import sha256, sha256_cbor, xxhash, xxhash_cbor
from kvpool.hashing.hasher import BlockHasher, hash_block_tokens
from kvpool.hashing.raw import encode_raw
from kvpool.hashing.request_hasher import get_request_block_hasher
from kvpool.hashing.seed import (
    DEFAULT_NONE_HASH_SEED,
    NonReproducibleHashWarning,
    ResolvedSeed,
    resolve_none_hash_seed,
    resolve_seed,
)

__all__ = [
    "DEFAULT_HASH_ALGORITHM",
    "DEFAULT_NONE_HASH_SEED",
    "HASH_ALGORITHM_NAMES",
    "VLLM_HASH_ALGORITHM_NAMES",
    "BlockHasher",
    "CoarseBlockHashes",
    "HashAlgorithm",
    "NonReproducibleHashWarning",
    "ResolvedSeed",
    "available_hash_algorithms",
    "encode_raw",
    "event_extra_keys",
    "generate_block_hash_extra_keys",
    "get_hash_algorithm",
    "get_hash_fn_by_name",
    "get_request_block_hasher",
    "hash_block_tokens",
    "lookahead_token_ids",
    "mm_start_index",
    "need_extra_keys",
    "resolve_block_hashes",
    "resolve_none_hash_seed",
    "resolve_seed",
    "sha256",
    "sha256_cbor",
    "untag_extra_key",
    "xxhash",
    "xxhash_cbor",
]
