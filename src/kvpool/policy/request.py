"""The scheduler's view of a request, as far as the KV cache manager reads it.

:class:`SchedulerRequest` is a :class:`kvpool.request.Request` (tokens, extra-key inputs,
``block_hashes``) plus the four fields vLLM's ``KVCacheManager`` reads from the scheduler's
request: ``num_computed_tokens``, ``status`` (the watermark applies to waiting and preempted
requests only), ``num_preemptions`` (prefix-cache statistics) and
``skip_reading_prefix_cache``. The scheduler, not the manager, updates them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvpool.request import Request


class RequestStatus(enum.Enum):
    """Where the scheduler keeps a request (vLLM's names)."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(eq=False)
class SchedulerRequest(Request):
    """A request with the scheduler fields the KV cache manager reads (module docstring)."""

    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    skip_reading_prefix_cache: bool = False


__all__ = ["RequestStatus", "SchedulerRequest"]
