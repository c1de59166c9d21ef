"""What hashing reads of a request: a protocol, so any request type can be hashed.

kvpool's :class:`~kvpool.request.Request` satisfies it, and so does vLLM's ``Request``.
Hashing sits below the request module (a request is built with a block hasher), so it names
the attributes it reads here instead of importing the class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvpool.errors import InvalidArgument


class HashedFeature(Protocol):
    """One multimodal item: its identifier and the prompt tokens it occupies."""

    @property
    def identifier(self) -> str | None: ...

    @property
    def offset(self) -> int: ...

    @property
    def length(self) -> int: ...


class HashedRequest(Protocol):
    """The request attributes the block hasher and the extra keys read."""

    @property
    def request_id(self) -> str: ...

    @property
    def block_hashes(self) -> Sequence[bytes]: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def prompt_token_ids(self) -> Any: ...

    @property
    def output_token_ids(self) -> Any: ...

    @property
    def all_token_ids(self) -> Any: ...

    @property
    def mm_features(self) -> Sequence[Any]: ...

    @property
    def lora_request(self) -> Any: ...

    @property
    def cache_salt(self) -> str | None: ...

    @property
    def prompt_embeds(self) -> Any: ...

    def prompt_embeds_digest(self, start: int, end: int) -> bytes: ...


def check_token_range(start: object, end: object) -> None:
    """Raise :class:`~kvpool.errors.InvalidArgument` unless ``0 <= start <= end`` are ints
    (a token range; one past the last token is fine, as in slicing)."""
    if type(start) is int and type(end) is int and 0 <= start <= end:
        return  # every decode step's hash and event asks: the common case first
    for name, value in (("start", start), ("end", end)):
        if type(value) is not int or value < 0:
            raise InvalidArgument(f"token range {name} must be an int >= 0, got {value!r}")
    if end < start:  # type: ignore[operator]
        raise InvalidArgument(f"token range end {end} < start {start}")


def token_slice(request: Any, start: int, end: int) -> list[int]:
    """``list(request.all_token_ids)[start:end]``, without copying the whole sequence where
    the request can do better (kvpool's ``Request.token_slice``): a decode step hashes, and
    an event reports, one block of a sequence that may be thousands of tokens long. A range
    that is not ``0 <= start <= end`` ints is :class:`~kvpool.errors.InvalidArgument`."""
    own = getattr(type(request), "token_slice", None)  # the class's: a proxy that forwards
    if own is not None:                                  # attributes must offer all_token_ids
        result: list[int] = own(request, start, end)
        return result
    check_token_range(start, end)
    return list(request.all_token_ids[start:end])


def packed_prompt(request: Any) -> bytes | None:
    """The prompt packed as the raw hash modes encode it, where the request offers it (kvpool's
    ``Request`` while its constructor runs the hasher); ``None`` otherwise."""
    return getattr(request, "_packed_prompt", None)
