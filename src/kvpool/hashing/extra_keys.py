"""Extra keys: what besides token ids identifies a block's content (BEHAVIOUR.md §2, §7).

Two requests with equal token ids can still need different KV: another LoRA adapter, other
images behind the same placeholder tokens, another tenant (cache salt), other prompt
embeddings. Each such input adds a key to the block's hash, in this fixed order:

===============  ==================================  ==========================  ==============
source           hashed form (vLLM 0.31+, "tagged")  event form (untagged)       when
===============  ==================================  ==========================  ==============
LoRA             ``("lora", name, path)``            ``name``                    every block
multimodal item  ``("mm", identifier, offset - s)``  ``(identifier, offset-s)``  item overlaps
cache salt       ``("cache_salt", salt)``            ``salt``                    ``s == 0``
prompt embeds    ``("prompt_embeds", digest)``       ``digest``                  embeds given
===============  ==================================  ==========================  ==============

for a token window ``[s, e)``; ``digest`` is SHA-256 of the raw bytes of ``embeds[s:e]``.
A salt enters only the first block (and only if non-empty), which suffices: every later
hash chains through it.

**Multimodal walk.** Items are sorted by offset and disjoint, so their end offsets are sorted
too. The walk starts at an item index and visits items in order: an item starting at or
after ``e`` ends the walk; an item ending at or before ``s`` is skipped; an overlapping item
adds a key (its offset relative to ``s``, negative if it began in an earlier block) and the
walk moves past it only if it ends within the window, because otherwise the next block
overlaps it too. The index where the walk stopped is returned so the next block resumes
there. Example: window ``[16, 32)``, item at offset 10 of length 20 → key
``("mm", id, -6)`` and the index advances; had the item ended at 40, same key, index stays.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from kvpool.errors import InvalidArgument
from kvpool.hashing.request_view import HashedFeature, HashedRequest

LORA_TAG = "lora"
MM_TAG = "mm"
CACHE_SALT_TAG = "cache_salt"
PROMPT_EMBEDS_TAG = "prompt_embeds"


def need_extra_keys(request: HashedRequest) -> bool:
    """Whether any block of ``request`` can carry extra keys (False → every block's are None)."""
    return bool(
        request.lora_request is not None
        or request.mm_features
        or request.cache_salt
        or request.prompt_embeds is not None
    )


def mm_start_index(mm_features: Sequence[HashedFeature], start: int) -> int:
    """Window search: the index of the first item ending after ``start``, or 0 if none does.

    Where a walk for a block starting at ``start`` must begin when no earlier walk left an
    index behind. 0 is returned when nothing can overlap: the walk then stops immediately
    because the last item ends at or before ``start``. O(log len(mm_features)).
    """
    index = bisect_right(mm_features, start, key=_feature_end)
    return index if index < len(mm_features) else 0


def _feature_end(feature: HashedFeature) -> int:
    return feature.offset + feature.length


def _mm_extra_keys(
    request: HashedRequest, start: int, end: int, start_mm_idx: int
) -> tuple[list[tuple[str, str, int]], int]:
    """Tagged keys of the items overlapping ``[start, end)`` and the index the walk stopped at."""
    features = request.mm_features
    keys: list[tuple[str, str, int]] = []
    if not features or features[-1].offset + features[-1].length <= start:
        return keys, start_mm_idx
    index = start_mm_idx
    if index < 0:
        # A negative index counts from the end (vLLM 0.25.1 passed -1: "the last item").
        if -index > len(features):
            raise InvalidArgument(
                f"multimodal start index {start_mm_idx} is out of range for {len(features)} items"
            )
        index += len(features)
    while index < len(features):
        feature = features[index]
        if feature.identifier is None:
            raise InvalidArgument(
                f"multimodal item {index} of request {request.request_id!r} has no identifier"
            )
        if feature.offset >= end:
            break
        item_end = feature.offset + feature.length
        if item_end <= start:
            index += 1
            continue
        keys.append((MM_TAG, feature.identifier, feature.offset - start))
        if item_end <= end:
            index += 1
        else:
            break
    return keys, index


def generate_block_hash_extra_keys(
    request: HashedRequest, start: int, end: int, start_mm_idx: int = 0
) -> tuple[tuple[Any, ...] | None, int]:
    """The tagged extra keys of token window ``[start, end)`` and the next multimodal index.

    Returns ``(None, index)`` when the window has no keys. ``start_mm_idx`` is where the
    multimodal walk begins (see the module docstring; negative counts from the end).
    """
    mm_keys, next_mm_idx = _mm_extra_keys(request, start, end, start_mm_idx)
    keys: list[Any] = []
    lora = request.lora_request
    if lora is not None:
        keys.append((LORA_TAG, lora.lora_name, lora.lora_path))
    keys.extend(mm_keys)
    if start == 0 and request.cache_salt:
        keys.append((CACHE_SALT_TAG, request.cache_salt))
    if request.prompt_embeds is not None:
        keys.append((PROMPT_EMBEDS_TAG, request.prompt_embeds_digest(start, end)))
    return (tuple(keys) if keys else None), next_mm_idx


def untag_extra_key(key: tuple[Any, ...]) -> Any:
    """The event form of one tagged key: LoRA → name, MM → (identifier, offset), else the value."""
    tag = key[0]
    if tag == LORA_TAG:
        return key[1]
    if tag == MM_TAG:
        return (key[1], key[2])
    if tag in (CACHE_SALT_TAG, PROMPT_EMBEDS_TAG):
        return key[1]
    raise InvalidArgument(f"unknown extra key tag {tag!r}")


def event_extra_keys(
    request: HashedRequest, start: int, end: int, num_lookahead_tokens: int = 0
) -> tuple[Any, ...] | None:
    """The untagged extra keys a ``BlockStored`` event reports for the block ``[start, end)``.

    Keys cover ``[start, end + num_lookahead_tokens)``, the window the block was hashed over
    (§2 lookahead). The multimodal walk starts from :func:`mm_start_index`, which yields the
    same keys as a walk restarted at 0 (§6.6) or resumed from the previous block (§6.7).
    ``None`` when the block has no keys.
    """
    window_end = end + num_lookahead_tokens
    keys, _ = generate_block_hash_extra_keys(
        request, start, window_end, mm_start_index(request.mm_features, start)
    )
    if keys is None:
        return None
    return tuple(untag_extra_key(key) for key in keys)


def lookahead_token_ids(request: HashedRequest, end: int, num_lookahead_tokens: int) -> list[int]:
    """The ``num_lookahead_tokens`` token ids after a block ending at ``end`` (may be fewer)."""
    if num_lookahead_tokens <= 0:
        return []
    return request.all_token_ids[end : end + num_lookahead_tokens]


__all__ = [
    "CACHE_SALT_TAG",
    "LORA_TAG",
    "MM_TAG",
    "PROMPT_EMBEDS_TAG",
    "event_extra_keys",
    "generate_block_hash_extra_keys",
    "lookahead_token_ids",
    "mm_start_index",
    "need_extra_keys",
    "untag_extra_key",
]
