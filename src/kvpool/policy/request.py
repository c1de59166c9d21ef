"""The scheduler's view of a request, as far as the KV cache manager reads it.

:class:`SchedulerRequest` is a :class:`kvpool.request.Request` (tokens, extra-key inputs,
``block_hashes``) plus the fields vLLM's ``KVCacheManager`` reads from the scheduler's request:
``num_computed_tokens``, ``status`` (the watermark applies to waiting and preempted requests
only), ``num_preemptions`` (prefix-cache statistics), ``skip_reading_prefix_cache`` and
``num_in_flight_tokens`` (vLLM 0.33). The scheduler, not the manager, updates them.
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
    #: Tokens scheduled (so counted in ``num_computed_tokens``) whose step has not come back
    #: yet: async scheduling schedules the next step first. Windows free blocks behind the
    #: processed tokens only (vLLM 0.33's field and rule; 0.25.1's requests have none).
    num_in_flight_tokens: int = 0


__all__ = ["RequestStatus", "SchedulerRequest"]
