"""The per-request block hasher: hash the blocks that became full (BEHAVIOUR.md §2).

A request calls its hasher at creation and after every appended output token. Hashing is
incremental: ``request.block_hashes`` already holds the hashes of the first
``len(block_hashes)`` blocks, so only later, *full* blocks are hashed, each chained on the
last existing hash. A partial block is never hashed; it will be once it fills up.

**Lookahead** (``num_hash_lookahead_tokens = L > 0``, vLLM 0.33). Some speculative-decoding
setups need a block's identity to include the ``L`` tokens that follow it. Then:

* a block ``[s, e)`` is hashed only once tokens up to ``e + L`` exist;
* its extra keys ``E`` are computed over ``[s, e + L)``, and the value hashed as extra keys
  is the tuple ``(E, t[e], ..., t[e+L-1])`` (never ``None``; ``E`` itself may be ``None``);
* the hashed tokens are still the block's own ``t[s:e]``;
* the multimodal index for the next block is found again by window search from ``e``: the
  walk over ``[s, e + L)`` may have moved past items that end inside the lookahead and
  therefore also overlap the next block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.hashing.extra_keys import (
    generate_block_hash_extra_keys,
    mm_start_index,
    need_extra_keys,
)
from kvpool.hashing.hasher import BlockHasher
from kvpool.hashing.request_view import HashedRequest, packed_prompt, token_slice


def get_request_block_hasher(
    hash_block_size: int,
    hasher: BlockHasher,
    num_hash_lookahead_tokens: int = 0,
) -> Callable[[HashedRequest], list[bytes]]:
    """A function returning the hashes of ``request``'s full blocks not yet in ``block_hashes``.

    The returned function does not modify the request; the request appends the result.
    Each call is O(new tokens), plus O(num_tokens) to read the request's token list.
    """
    if not isinstance(hash_block_size, int) or hash_block_size <= 0:
        raise InvalidConfig(f"hash_block_size must be a positive int, got {hash_block_size!r}")
    if not isinstance(num_hash_lookahead_tokens, int) or num_hash_lookahead_tokens < 0:
        raise InvalidConfig(
            "num_hash_lookahead_tokens must be a non-negative int, "
            f"got {num_hash_lookahead_tokens!r}"
        )
    if not isinstance(hasher, BlockHasher):
        raise InvalidConfig(f"hasher must be a BlockHasher, got {type(hasher).__name__}")
    hbs = hash_block_size
    lookahead = num_hash_lookahead_tokens

    def request_block_hasher(request: HashedRequest) -> list[bytes]:
        start = len(request.block_hashes) * hbs
        hashable_end = request.num_tokens - lookahead
        if start + hbs > hashable_end:
            return []
        stop = start + (hashable_end - start) // hbs * hbs
        parent = request.block_hashes[-1] if request.block_hashes else None
        if lookahead == 0 and not need_extra_keys(request):
            packed = packed_prompt(request)
            if packed is not None and 4 * stop <= len(packed):
                hashes = hasher.hash_packed_blocks(parent, packed[4 * start : 4 * stop], hbs)
                if hashes is not None:
                    return hashes
            # The new tokens only: ``all_token_ids`` copies the whole sequence (a decode
            # step fills one block of a sequence thousands of tokens long).
            return hasher.hash_blocks(parent, token_slice(request, start, stop), hbs)
        token_ids = request.all_token_ids
        if lookahead == 0 and not need_extra_keys(request):
            return hasher.hash_blocks(parent, token_ids[start:stop], hbs)
        extra_keys = _new_blocks_extra_keys(request, token_ids, start, stop, hbs, lookahead)
        return hasher.hash_blocks(parent, token_ids[start:stop], hbs, extra_keys)

    return request_block_hasher


def _new_blocks_extra_keys(
    request: HashedRequest,
    token_ids: list[int],
    start: int,
    stop: int,
    hbs: int,
    lookahead: int,
) -> list[Any]:
    """The extra-keys argument of every block in ``[start, stop)``, in order."""
    features = request.mm_features
    # Window search rather than vLLM 0.25.1's "-1" (the last item): a block completed by
    # generated tokens can still overlap an item that is not the last one (0.31+).
    mm_index = 0 if start == 0 else mm_start_index(features, start)
    extra_keys: list[Any] = []
    for block_start in range(start, stop, hbs):
        block_end = block_start + hbs
        if lookahead:
            keys, _ = generate_block_hash_extra_keys(
                request, block_start, block_end + lookahead, mm_index
            )
            mm_index = mm_start_index(features, block_end)
            extra_keys.append((keys, *token_ids[block_end : block_end + lookahead]))
        else:
            keys, mm_index = generate_block_hash_extra_keys(
                request, block_start, block_end, mm_index
            )
            extra_keys.append(keys)
    return extra_keys


__all__ = ["get_request_block_hasher"]
