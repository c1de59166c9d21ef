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


class RefCountOverflow(KvPoolError, OverflowError):
    """A ``touch`` would take a block past :data:`kvpool.spec.state.MAX_REF_CNT` references.

    vLLM's Python ints never overflow; the fast backend counts in int32, so every backend
    refuses at the same limit (2**31 - 1 holders per block) to stay identical.
    """


class ReentrantCall(KvPoolError, RuntimeError):
    """A reuse watcher or metrics collector called a state-changing pool method while the
    pool was delivering its callbacks. Refused before anything changed; queries are allowed.
    """


class CallbackError(KvPoolError, RuntimeError):
    """A user callback raised; the operation completed first, then the first error is re-raised.

    ``result`` is what the operation returned (e.g. the freshly allocated ids), so nothing is
    lost; the original exception is chained as ``__cause__``. Every callback of the call ran.
    """

    result: object = None


class WatcherError(CallbackError):
    """The first callback to fail was a reuse watcher (see :class:`CallbackError`)."""


class MetricsCollectorError(CallbackError):
    """The first callback to fail was a metrics collector's (see :class:`CallbackError`)."""


class EventGap(KvPoolError, ValueError):
    """An event stream skipped or repeated a sequence number (``kvpool.events.replay``)."""


class InvalidEvent(KvPoolError, ValueError):
    """``replay`` met an event that no pool emits: a removal without exactly one hash, or the
    removal of a key the (complete) stream never stored."""


__all__ = [
    "AlreadyQueued",
    "BackendUnavailable",
    "CachingDisabled",
    "CallbackError",
    "DoubleFree",
    "EventGap",
    "ForeignBlock",
    "HashStateError",
    "InvalidArgument",
    "InvalidBlockId",
    "InvalidConfig",
    "InvalidEvent",
    "InvalidGroupId",
    "KvPoolError",
    "MetricsCollectorError",
    "NoFreeBlocks",
    "NotQueued",
    "NullBlockMisuse",
    "RefCountOverflow",
    "ReentrantCall",
    "WatcherError",
]


class UnknownRequest(KvPoolError, ValueError):
    """The KV cache manager holds nothing for this request (never allocated, or already
    freed); vLLM silently does nothing."""


__all__ += ["UnknownRequest"]


class NotRetained(KvPoolError, ValueError):
    """``release_copy_endpoints`` was given a block id that is not a retained copy endpoint
    handed out by ``take_kv_cache_block_copies`` (never retained, or already released)."""


__all__ += ["NotRetained"]
