"""Typed errors of the GPU layer (all :class:`~kvpool.errors.KvPoolError`)."""

from __future__ import annotations

from kvpool.errors import InvalidArgument, InvalidBlockId, KvPoolError


class KVCacheDoesNotFit(KvPoolError, MemoryError):
    """The KV tensors asked for do not fit the device's free memory.

    ``asked_bytes`` and ``free_bytes`` carry the two numbers the message names; nothing was
    allocated.
    """

    def __init__(self, message: str, asked_bytes: int, free_bytes: int) -> None:
        super().__init__(message)
        self.asked_bytes = asked_bytes
        self.free_bytes = free_bytes


class InvalidCopyPair(InvalidArgument):
    """A block copy or swap batch is unsafe: a destination that is also a source of the batch,
    named twice, still shared, or the null block. Nothing was copied."""


class InvalidSlot(InvalidBlockId):
    """A slot, block table row or token position lies outside what the tables hold."""


__all__ = ["InvalidCopyPair", "InvalidSlot", "KVCacheDoesNotFit"]
