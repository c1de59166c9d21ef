"""Typed errors of kvpool (BEHAVIOUR.md §12).

Every failure is a :class:`KvPoolError` *and* the builtin exception vLLM raises in the same
situation, so code written against vLLM (``except ValueError``) keeps working. Each message
names the offending ids or arguments. Raising any of these leaves the pool exactly as it was.
"""

from __future__ import annotations


class KvPoolError(Exception):
    """Root of every error kvpool raises on purpose."""


class InvalidConfig(KvPoolError, ValueError):
    """A constructor or configuration argument is invalid (vLLM: assertion / ValueError)."""


class InvalidArgument(KvPoolError, ValueError):
    """An operation argument is malformed: negative counts, wrong lengths, empty group lists."""


class InvalidBlockId(KvPoolError, ValueError):
    """A block id is outside ``[0, num_blocks)`` (vLLM silently wraps negative ids)."""


class InvalidGroupId(KvPoolError, ValueError):
    """A KV cache group id is outside ``[0, 2**32)`` (vLLM: OverflowError while packing)."""


class NoFreeBlocks(KvPoolError, ValueError):
    """More blocks were requested than the free queue holds."""


class DoubleFree(KvPoolError, ValueError):
    """A batch releases more references than a block holds (vLLM: ref_cnt silently goes to -1)."""


class NullBlockMisuse(KvPoolError, ValueError):
    """The null block (id 0) was passed where it is not allowed."""


class AlreadyQueued(KvPoolError, RuntimeError):
    """A block that is already in the free queue was queued again."""


class NotQueued(KvPoolError, RuntimeError):
    """A block that is not in the free queue was removed from it (or touched with ref 0)."""


class ForeignBlock(KvPoolError, ValueError):
    """A block owned by another pool was passed to an operation that only takes local blocks."""


class HashStateError(KvPoolError, AssertionError):
    """A block's cache identity does not allow the operation (already keyed, free, ...)."""


class CachingDisabled(KvPoolError, RuntimeError):
    """A prefix-cache write was attempted on a pool built with ``enable_caching=False``."""


class BackendUnavailable(KvPoolError, ImportError):
    """The requested backend is unknown or its optional dependencies are not installed."""


class WatcherError(KvPoolError, RuntimeError):
    """A reuse watcher raised; the operation completed first, then the first error is re-raised.

    The original exception is chained as ``__cause__``.
    """


__all__ = [
    "AlreadyQueued",
    "BackendUnavailable",
    "CachingDisabled",
    "DoubleFree",
    "ForeignBlock",
    "HashStateError",
    "InvalidArgument",
    "InvalidBlockId",
    "InvalidConfig",
    "InvalidGroupId",
    "KvPoolError",
    "NoFreeBlocks",
    "NotQueued",
    "NullBlockMisuse",
    "WatcherError",
]


class UnknownRequest(KvPoolError, ValueError):
    """The KV cache manager holds nothing for this request (never allocated, or already
    freed); vLLM silently does nothing."""


__all__ += ["UnknownRequest"]
