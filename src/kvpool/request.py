"""The slice of a vLLM request that block hashing reads (BEHAVIOUR.md §2).

A :class:`Request` carries token ids and the inputs that become *extra keys* (LoRA adapter,
multimodal items, cache salt, prompt embeddings), plus ``block_hashes``: one hash per full
``hash_block_size`` chunk of the token sequence. ``block_hashes`` is append-only: a hash, once
computed, covers a prefix that never changes, so later blocks only ever add entries. It is a
:class:`~kvpool.hash_list.BlockHashList`: a ``list`` that also keeps its digests packed in one
byte buffer, which the fast backend's batch kernels read without a pass over the list.

The request knows nothing about how hashes are computed. It calls the ``block_hasher`` given
at construction (usually :func:`kvpool.hashing.get_request_block_hasher`) once when it is
created and again after every :meth:`Request.append_output_token_ids`; the hasher returns only
the hashes of blocks that became full since the last call. The prompt's hashes are packed
right away (an admission reads them all); a decode step's one new hash is packed when a
reader first asks for it (readers of one hash take it from the list).
"""

from __future__ import annotations

import hashlib
import numbers
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpool.errors import InvalidArgument
from kvpool.hash_list import BlockHashList
from kvpool.hashing.raw import pack_int32
from kvpool.hashing.request_view import check_token_range

MAX_TOKEN_ID = 2**63 - 1
"""Largest token id a request accepts: token ids are non-negative and fit int64 (what vLLM's
token arrays hold); ``bool`` is not a token id."""

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
    """A request's tokens, extra-key inputs and append-only ``block_hashes`` (a
    :class:`~kvpool.hash_list.BlockHashList`).

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
    block_hashes: BlockHashList = field(default_factory=BlockHashList, init=False)
    # sha256 digests of prompt_embeds[s:e] keyed by (s, e): the same window is hashed once per
    # block and again for every event that reports it, and embeddings are large.
    _embeds_digests: dict[tuple[int, int], bytes] = field(
        default_factory=dict, init=False, repr=False
    )
    # The prompt packed as the raw hash modes encode it (pack_int32), set only while
    # __post_init__ runs the block hasher: the prompt list is the caller's to mutate later.
    _packed_prompt: bytes | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_token_ids, packed = _checked_tokens(self.prompt_token_ids,
                                                        "prompt_token_ids", 0, pack=True)
        self.output_token_ids = as_token_ids(self.output_token_ids, "output_token_ids")
        if isinstance(self.mm_features, (str, bytes)) or not isinstance(self.mm_features, Iterable):
            raise InvalidArgument(
                f"mm_features must be a list of MultiModalFeature, got {self.mm_features!r}"
            )
        self.mm_features = list(self.mm_features)
        _check_mm_features(self.mm_features)
        _check_lora_request(self.lora_request)
        for name in ("cache_salt", "session_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidArgument(f"{name} must be a str or None, got {value!r}")
        _check_prompt_embeds(self.prompt_embeds, len(self.prompt_token_ids))
        if self.block_hasher is not None:
            if not callable(self.block_hasher):
                raise InvalidArgument(
                    f"block_hasher must be callable (request -> list of bytes), "
                    f"got {self.block_hasher!r}"
                )
            # For the hasher, in this call only (never stale), and only where the prompt is
            # this class's own token list (a subclass may define its tokens otherwise).
            if type(self).all_token_ids is Request.all_token_ids:
                self._packed_prompt = packed
            try:
                self.block_hashes.extend(_hasher_result(self.block_hasher(self)))
            finally:
                self._packed_prompt = None
            self.block_hashes.pack()

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output token ids, as a new list (O(num_tokens))."""
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without joining the two lists (O(end - start)); a
        range that is not ``0 <= start <= end`` ints is :class:`InvalidArgument`."""
        check_token_range(start, end)
        prompt, output = self.prompt_token_ids, self.output_token_ids
        if type(self).all_token_ids is not Request.all_token_ids or not (
                type(prompt) is list and type(output) is list):
            return list(self.all_token_ids[start:end])  # a subclass's own tokens, or a caller's
        n = len(prompt)
        if end <= n:
            return prompt[start:end]
        if start >= n:
            return output[start - n : end - n]
        return prompt[start:] + output[: end - n]

    @property
    def num_tokens(self) -> int:
        """Number of prompt plus output tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Number of prompt tokens."""
        return len(self.prompt_token_ids)

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Append generated tokens, then hash the blocks they completed (if a hasher is set).

        Tokens are checked as at construction (:func:`as_token_ids`); on an invalid token
        nothing is appended.
        """
        if type(token_ids) is int and 0 <= token_ids <= MAX_TOKEN_ID:
            # One plain token, a decode step's: what the checks below accept and append, at
            # list-append cost (the general path's type checks cost ~4 µs here).
            self.output_token_ids.append(token_ids)
            added = 1
        else:
            start = len(self.prompt_token_ids) + len(self.output_token_ids)
            values: Any = token_ids
            if type(token_ids) is not list and isinstance(
                token_ids, (numbers.Integral, np.integer)
            ) and not isinstance(token_ids, (bool, np.bool_)):
                values = [token_ids]
            checked = as_token_ids(values, "token_ids", start)
            self.output_token_ids.extend(checked)
            added = len(checked)
        if self.block_hasher is not None:
            new = self.block_hasher(self)
            # A decode step's answer, checked inline: no hash, or the one of the block the
            # token filled. Anything else is checked in full; a bad answer takes the tokens
            # back out, so the request stays as it was.
            if new.__class__ is list and (
                not new or (len(new) == 1 and new[0].__class__ is bytes)
            ):
                self.block_hashes.extend(new)
                return
            try:
                self.block_hashes.extend(_hasher_result(new))
            except InvalidArgument:
                del self.output_token_ids[len(self.output_token_ids) - added:]
                raise

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


def _hasher_result(hashes: object) -> list[bytes]:
    """What a ``block_hasher`` returned, checked: a list (or tuple) of ``bytes`` digests,
    else :class:`InvalidArgument` naming the entry (an int or ``None`` would become a
    "hash" no pool accepts, or fail later far from the hasher). O(len(hashes))."""
    if type(hashes) is not list and type(hashes) is not tuple:
        raise InvalidArgument(
            f"block_hasher must return a list of bytes, got {type(hashes).__name__}"
        )
    for i, h in enumerate(hashes):
        if not isinstance(h, bytes):
            raise InvalidArgument(
                f"block_hasher returned {h!r} at position {i}, not a bytes digest"
            )
    return hashes  # type: ignore[return-value]  # checked above: list or tuple of bytes


def _is_int(value: object) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def as_token_ids(values: Any, what: str = "token_ids", start: int = 0) -> list[int]:
    """``values`` as a list of Python ints, each in ``[0, MAX_TOKEN_ID]``.

    numpy integers (and 1-D integer arrays) become Python ints, so ``np.arange(8)`` hashes
    exactly like ``list(range(8))``: the hash functions serialise a numpy int differently,
    which would be a silent prefix-cache miss. Anything else — ``bool``, floats, strings,
    ``None``, negative or larger ids — raises :class:`InvalidArgument` naming the token's
    position in the request (``start`` + index). O(len(values)).
    """
    return _checked_tokens(values, what, start, pack=False)[0]


_PACK_AT_LEAST = 64
"""Shortest token list :func:`_checked_tokens` checks by packing: below it, numpy's fixed cost
per call exceeds the ``min``/``max`` passes it replaces."""


def _checked_tokens(values: Any, what: str, start: int,
                    pack: bool) -> tuple[list[int], bytes | None]:
    """:func:`as_token_ids`, and with ``pack`` the tokens as
    :func:`~kvpool.hashing.raw.pack_int32` bytes (``None`` if some token is outside int32 or
    the list is short). Packing is how the range is checked then, in place of the ``min`` and
    ``max`` passes (which cost more: ~50 against ~20 ns a token), so the raw hash modes get
    the packed prompt for free instead of packing it again."""
    if type(values) is list or type(values) is tuple:
        tokens = list(values)  # the common case, ahead of the ABC check below (~1 µs)
    elif isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise InvalidArgument(
                f"{what} must be a 1-D integer array, got {values.dtype} {values.shape}"
            )
        tokens = values.tolist()
    elif isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidArgument(f"{what} must be a sequence of ints, got {values!r}")
    else:
        tokens = list(values)
    # Exactly ints? Counting them in a list of types costs ~28 ns a token, a set of the types
    # ~40 (measured on the kit's prompts): prompts are long, and this runs once per token.
    if list(map(type, tokens)).count(int) != len(tokens):
        for i, t in enumerate(tokens):
            if type(t) is not int:
                if not _is_int(t):
                    raise InvalidArgument(
                        f"token {start + i} ({what}[{i}]) is {t!r} ({type(t).__name__}), "
                        "not an int"
                    )
                tokens[i] = int(t)
    if pack and len(tokens) >= _PACK_AT_LEAST:
        try:
            packed = pack_int32(tokens)  # every token is an int here: only OverflowError
        except OverflowError:
            packed = None
        if packed is not None and int(np.frombuffer(packed, "<i4").min()) >= 0:
            return tokens, packed  # all in [0, 2**31): inside [0, MAX_TOKEN_ID]
    if tokens and (min(tokens) < 0 or max(tokens) > MAX_TOKEN_ID):
        i, t = next((i, t) for i, t in enumerate(tokens) if not 0 <= t <= MAX_TOKEN_ID)
        raise InvalidArgument(
            f"token {start + i} ({what}[{i}]) is {t}, outside [0, {MAX_TOKEN_ID}]"
        )
    return tokens, None


def _check_lora_request(lora: Any) -> None:
    """``None`` or a LoRA request: ``lora_name`` and ``lora_path`` strings (hashed) and an
    int ``lora_int_id`` (reported in events). Duck-typed, so vLLM's ``LoRARequest`` works."""
    if lora is None:
        return
    name = getattr(lora, "lora_name", None)
    path = getattr(lora, "lora_path", "")
    lora_id = getattr(lora, "lora_int_id", None)
    if not isinstance(name, str) or not isinstance(path, str) or not _is_int(lora_id):
        raise InvalidArgument(
            "lora_request must have lora_name (str), lora_int_id (int) and lora_path (str), "
            f"got {lora!r}"
        )


def _check_prompt_embeds(embeds: Any, num_prompt_tokens: int) -> None:
    """``None`` or one row per prompt token: ``shape[0] == len(prompt_token_ids)``, so every
    block's window of rows exists (a shorter array would hash fewer rows, silently)."""
    if embeds is None:
        return
    shape = getattr(embeds, "shape", None)
    try:
        rows = int(shape[0]) if shape is not None and len(shape) >= 1 else None
    except (TypeError, ValueError):
        rows = None
    if rows is None or not hasattr(embeds, "__getitem__"):
        raise InvalidArgument(
            f"prompt_embeds must be an array or tensor of shape (num_prompt_tokens, ...), "
            f"got {type(embeds).__name__} with shape {shape!r}"
        )
    if rows != num_prompt_tokens:
        raise InvalidArgument(
            f"prompt_embeds has {rows} rows for {num_prompt_tokens} prompt tokens"
        )


def _check_mm_features(features: list[MultiModalFeature]) -> None:
    """Features must be sorted by offset and must not overlap.

    The hashing walk relies on this: with sorted, disjoint items the end offsets are sorted
    too, so the first item that can overlap a block is found by binary search.
    """
    previous_end = 0
    for index, feature in enumerate(features):
        identifier = getattr(feature, "identifier", None)
        offset = getattr(feature, "offset", None)
        length = getattr(feature, "length", None)
        if not (identifier is None or isinstance(identifier, str)) or not (
            _is_int(offset) and _is_int(length)
        ):
            raise InvalidArgument(
                f"multimodal feature {index} must have identifier (str or None), offset and "
                f"length (ints), got {feature!r}"
            )
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


__all__ = [
    "MAX_TOKEN_ID",
    "BlockHasherFn",
    "LoRARequest",
    "MultiModalFeature",
    "Request",
    "as_token_ids",
]
