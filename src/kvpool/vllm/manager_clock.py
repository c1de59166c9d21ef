"""The KV manager's time inside vLLM's scheduler, and what timing it costs.

:class:`ManagerClock` wraps a manager's public methods and sums the wall time of their
outermost calls (a method calling another is counted once). The scheduler benchmark
(:mod:`kvpool.vllm.scheduler_run`) turns that sum into CPU time with the steps' own
CPU/wall ratio.

A bracket around ~140,000–260,000 calls is not free: the clock read, the ``try`` and the
forwarding of the arguments put about 0.1 µs into every call, on both sides — 15–30 ms
of a replay, a tenth of kvpool's manager time, which brings the ratio toward 1.
:meth:`ManagerClock.calibrate` measures that share on the machine, in the process, right
after the replay: a method that does nothing, timed exactly as the manager's are, less the
same method called plainly. The benchmark reports the raw sum and the sum less
``calls x`` that share; both sides make the same calls (equal decisions), so the net
figures differ from the raw ones by about the same time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


class ManagerClock:
    """Time inside the KV manager's public methods, outermost calls only.

    Each call is timed with ``perf_counter``, not ``thread_time``: the CPU clock is a system
    call that costs 2–3 µs per read on these machines, and a call-by-call CPU clock would
    add that to every call on both sides, squeezing the ratio toward 1."""

    METHODS = ("get_computed_blocks", "allocate_slots", "free", "pop_blocks_for_free",
               "get_num_common_prefix_blocks", "take_events", "get_blocks", "get_block_ids",
               "make_prefix_cache_stats", "new_step_starts", "take_new_block_ids",
               "cache_blocks", "reset_prefix_cache", "evict_blocks", "remove_skipped_blocks",
               "get_block_ids_for_computed_tokens", "create_kv_cache_blocks")

    def __init__(self, manager: Any, by_method: bool = False) -> None:
        self.seconds = 0.0
        self.calls = 0
        #: With ``by_method``: per method, ``[seconds, calls]`` of its outermost calls.
        self.by_method: dict[str, list[float]] = {}
        depth = [0]
        clock = time.perf_counter

        def wrap(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
            total = self.by_method.setdefault(name, [0.0, 0]) if by_method else None

            def timed(*args: Any, **kwargs: Any) -> Any:
                if depth[0]:
                    return method(*args, **kwargs)
                depth[0] = 1
                began = clock()
                try:
                    return method(*args, **kwargs)
                finally:
                    spent = clock() - began
                    self.seconds += spent
                    self.calls += 1
                    depth[0] = 0
                    if total is not None:
                        total[0] += spent
                        total[1] += 1
            return timed

        for name in self.METHODS:
            method = getattr(manager, name, None)
            if method is not None:
                setattr(manager, name, wrap(name, method))

    @staticmethod
    def calibrate(rounds: int = 7, calls: int = 20_000) -> float:
        """Wall seconds the bracket adds to one call: what it records around a method that
        does nothing, less what calling that method plainly costs (the call itself is the
        manager's cost: the scheduler pays it with or without the clock).

        Measured for the scheduler's two shapes of call — ``allocate_slots(request, n,
        num_lookahead_tokens=k)`` and ``cache_blocks(request, n)`` — as medians over
        ``rounds``; the smaller of the two is returned (never below 0), so that what the
        net figures take off is, if anything, too little."""
        shapes = []
        for keyword in (True, False):
            shares = []
            for _ in range(rounds):
                name = "allocate_slots" if keyword else "cache_blocks"
                probe = _Idle()
                clock = ManagerClock(probe)
                _loop(getattr(probe, name), keyword, calls)  # the clock records each bracket
                bracket = clock.seconds / clock.calls
                plain = _loop(getattr(_Idle(), name), keyword, calls) - \
                    _loop(None, keyword, calls)
                shares.append(bracket - plain)
            shapes.append(statistics.median(shares))
        return max(0.0, min(shapes))


class _Idle:
    """Two manager methods that do nothing, with the signatures the scheduler calls."""

    def allocate_slots(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Any = None, num_lookahead_tokens: int = 0) -> None:
        return None

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        return None


def _loop(method: Callable[..., Any] | None, keyword: bool, calls: int) -> float:
    """Seconds per iteration of a loop calling ``method`` as the scheduler does (``None``:
    the bare loop)."""
    request = object()
    began = time.perf_counter()
    if method is None:
        for _ in range(calls):
            pass
    elif keyword:
        for _ in range(calls):
            method(request, 1, num_lookahead_tokens=0)
    else:
        for _ in range(calls):
            method(request, 1)
    return (time.perf_counter() - began) / calls


__all__ = ["ManagerClock"]
