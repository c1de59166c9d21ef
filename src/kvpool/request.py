"""The slice of a vLLM request that block hashing reads (BEHAVIOUR.md §2).

A :class:`Request` carries token ids and the inputs that become *extra keys* (LoRA adapter,
multimodal items, cache salt, prompt embeddings), plus ``block_hashes``: one hash per full
``hash_block_size`` chunk of the token sequence. ``block_hashes`` is append-only: a hash, once
computed, covers a prefix that never changes, so later blocks only ever add entries.

The request knows nothing about how hashes are computed. It calls the ``block_hasher`` given
at construction (usually :func:`kvpool.hashing.get_request_block_hasher`) once when it is
created and again after every :meth:`Request.append_output_token_ids`; the hasher returns only
the hashes of blocks that became full since the last call.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvpool.errors import InvalidArgument

BlockHasherFn = Callable[["Request"], list[bytes]]
"""Computes the hashes of the request's blocks that are full but not yet hashed."""


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """A LoRA adapter: its name and path enter the block hash, its int id only events."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""


@dataclass(frozen=True, slots=True)
class MultiModalFeature:
    """One multimodal item occupying prompt tokens ``[offset, offset + length)``.

    ``identifier`` is the item's content hash; a feature without one cannot be hashed.
    """

    identifier: str | None
    offset: int
    length: int

    @property
    def end(self) -> int:
        """One past the last token the item occupies."""
        return self.offset + self.length


@dataclass(eq=False)
class Request:
    """A request's tokens, extra-key inputs and append-only ``block_hashes``.

    Token lists are copied at construction. ``prompt_embeds`` is optional: a numpy array, a
    torch tensor or anything sliceable along axis 0 whose slices have ``.tobytes()``.
    Requests compare by identity, like vLLM's.
    """

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    lora_request: LoRARequest | None = None
    mm_features: list[MultiModalFeature] = field(default_factory=list)
    cache_salt: str | None = None
    prompt_embeds: Any = field(default=None, repr=False)
    session_id: str | None = None
    block_hasher: BlockHasherFn | None = field(default=None, repr=False)
    block_hashes: list[bytes] = field(default_factory=list, init=False)
    # sha256 digests of prompt_embeds[s:e] keyed by (s, e): the same window is hashed once per
    # block and again for every event that reports it, and embeddings are large.
    _embeds_digests: dict[tuple[int, int], bytes] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.output_token_ids = list(self.output_token_ids)
        self.mm_features = list(self.mm_features)
        _check_mm_features(self.mm_features)
        if self.block_hasher is not None:
            self.block_hashes.extend(self.block_hasher(self))

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output token ids, as a new list (O(num_tokens))."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        """Number of prompt plus output tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Number of prompt tokens."""
        return len(self.prompt_token_ids)

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Append generated tokens, then hash the blocks they completed (if a hasher is set)."""
        if isinstance(token_ids, int):
            self.output_token_ids.append(token_ids)
        else:
            self.output_token_ids.extend(token_ids)
        if self.block_hasher is not None:
            self.block_hashes.extend(self.block_hasher(self))

    def prompt_embeds_digest(self, start: int, end: int) -> bytes:
        """SHA-256 of the raw bytes of ``prompt_embeds[start:end]``, memoised per ``(start, end)``.

        Raises :class:`InvalidArgument` if the request has no prompt embeddings.
        """
        if self.prompt_embeds is None:
            raise InvalidArgument(f"request {self.request_id!r} has no prompt embeddings")
        window = (start, end)
        digest = self._embeds_digests.get(window)
        if digest is None:
            digest = hashlib.sha256(_tensor_bytes(self.prompt_embeds[start:end])).digest()
            self._embeds_digests[window] = digest
        return digest


def _check_mm_features(features: list[MultiModalFeature]) -> None:
    """Features must be sorted by offset and must not overlap.

    The hashing walk relies on this: with sorted, disjoint items the end offsets are sorted
    too, so the first item that can overlap a block is found by binary search.
    """
    previous_end = 0
    for index, feature in enumerate(features):
        if feature.offset < 0 or feature.length < 0:
            raise InvalidArgument(
                f"multimodal feature {index} has offset {feature.offset} and length "
                f"{feature.length}; both must be non-negative"
            )
        if feature.offset < previous_end:
            raise InvalidArgument(
                f"multimodal feature {index} starts at {feature.offset}, before the end "
                f"({previous_end}) of the previous one; features must be sorted and disjoint"
            )
        previous_end = feature.end


def _tensor_bytes(block: Any) -> bytes:
    """The raw memory of ``block`` in C order: what vLLM hashes for prompt embeddings.

    Torch tensors are reinterpreted as bytes before conversion so dtypes numpy lacks
    (bfloat16) work too. torch is only consulted if the caller already imported it.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(block, torch.Tensor):
        flat = block.detach().cpu().flatten().contiguous()
        return bytes(flat.view(torch.uint8).numpy().tobytes())
    return bytes(block.tobytes())


__all__ = ["BlockHasherFn", "LoRARequest", "MultiModalFeature", "Request"]
