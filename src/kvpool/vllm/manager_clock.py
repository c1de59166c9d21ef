"""The KV manager's time inside vLLM's scheduler, and what timing it costs.

:class:`ManagerClock` wraps a manager's public methods and sums the wall time of their
outermost calls (a method calling another is counted once). The scheduler benchmark
(:mod:`kvpool.vllm.scheduler_run`) turns that sum into CPU time with the steps' own
CPU/wall ratio.

A bracket around ~140,000–260,000 calls is not free: the clock read, the ``try`` and the
forwarding of the arguments put about 80 ns into every call, on both sides — 10–21 ms of a
replay, 3–6% of kvpool's manager time, which brings the ratio toward 1.
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

from kvpool.errors import InvalidArgument


class ManagerClock:
    """Time inside the KV manager's public methods, outermost calls only.

    Each call is timed with ``perf_counter``, not ``thread_time``: the CPU clock is a system
    call that costs 2–3 µs per read on these machines, and a call-by-call CPU clock would
    add that to every call on both sides, squeezing the ratio toward 1."""

    METHODS = ("get_computed_blocks", "allocate_slots", "free", "pop_blocks_for_free",
               "get_num_common_prefix_blocks", "take_events", "get_blocks", "get_block_ids",
               "make_prefix_cache_stats", "new_step_starts", "take_new_block_ids",
               "cache_blocks", "reset_prefix_cache", "evict_blocks", "remove_skipped_blocks",
               "get_block_ids_for_computed_tokens", "create_kv_cache_blocks",
               # vLLM 0.33's scheduler also calls these (estimate_cached_tokens once per
               # request, at its first output; the take_* once per step)
               "estimate_cached_tokens", "record_prefix_cache_stats",
               "take_kv_cache_block_copies", "take_boundary_state_offloads",
               "finalize_partial_tail_offloads", "get_computed_blocks_for_connector",
               "record_blocks_for_zeroing", "truncate_computed_blocks")
    """Every method vLLM's schedulers (0.25, 0.33) call on their KV manager (a test checks
    the list against the schedulers' source). Not timed: the ``usage`` property (read once
    per step), and the calls 0.33 makes through the manager into its coordinator (the
    blocks in-flight prefills still need, with a prefill reserve) and its block pool
    (deferred frees, with a KV-consumer connector and batches in flight): a clock there
    would also bracket vLLM's manager's own inner calls, on one side only."""

    def __init__(self, manager: Any, by_method: bool = False, block_size: int = 0) -> None:
        if type(block_size) is not int or block_size < 0:
            raise InvalidArgument(f"block_size must be an int >= 0 (0: no kinds of call), "
                                  f"got {block_size!r}")
        self.seconds = 0.0
        self.calls = 0
        #: With ``by_method``: per method, ``[seconds, calls]`` of its outermost calls; with
        #: a ``block_size`` as well, ``allocate_slots`` also per kind of call
        #: (:func:`allocate_kind`, keys ``"allocate_slots / <kind>"``).
        self.by_method: dict[str, list[float]] = {}
        #: The seconds of the last outermost call (``None`` after a nested one).
        self.last_spent: float | None = None
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
                    self.last_spent = spent
                    depth[0] = 0
                    if total is not None:
                        total[0] += spent
                        total[1] += 1
            return timed

        for name in self.METHODS:
            method = getattr(manager, name, None)
            if method is not None:
                setattr(manager, name, wrap(name, method))
        if by_method and block_size > 0 and hasattr(manager, "allocate_slots"):
            manager.allocate_slots = self._by_kind(manager.allocate_slots, block_size)

    def _by_kind(self, timed: Callable[..., Any], block_size: int) -> Callable[..., Any]:
        """``timed`` (the clocked ``allocate_slots``) with each outermost call's seconds also
        counted under its kind; the kind is read outside the clock's bracket."""
        kinds = self.by_method

        def classified(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
            admission = "new_computed_blocks" in kwargs or len(args) >= 2
            computed = request.num_computed_tokens
            self.last_spent = None
            result = timed(request, num_new_tokens, *args, **kwargs)
            if self.last_spent is not None:
                kind = allocate_kind(admission, result, computed, num_new_tokens, block_size)
                entry = kinds.setdefault(f"allocate_slots / {kind}", [0.0, 0])
                entry[0] += self.last_spent
                entry[1] += 1
            return result
        return classified

    @staticmethod
    def calibrate(rounds: int = 7, calls: int = 20_000) -> float:
        """Wall seconds the bracket adds to one call: what it records around a method that
        does nothing, less what calling that method plainly costs (the call itself is the
        manager's cost: the scheduler pays it with or without the clock).

        Measured for the scheduler's two shapes of call — ``allocate_slots(request, n,
        num_lookahead_tokens=k)`` and ``cache_blocks(request, n)`` — as medians over
        ``rounds``; the smaller of the two is returned (never below 0), so that what the
        net figures take off is, if anything, too little."""
        for name, value in (("rounds", rounds), ("calls", calls)):
            if type(value) is not int or value < 1:
                raise InvalidArgument(f"{name} must be a positive int, got {value!r}")
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


def allocate_kind(admission: bool, result: Any, computed: int, num_new_tokens: int,
                  block_size: int) -> str:
    """What an ``allocate_slots`` call did, from what both managers show alike (equal
    decisions): an admission (the waiting queue's call, which passes the lookup's hits) or a
    running request's step; refused (``None``); whether it returned new blocks; whether its
    tokens fill a block (``computed`` is the request's count before the call)."""
    if type(block_size) is not int or block_size < 1:
        raise InvalidArgument(f"block_size must be a positive int, got {block_size!r}")
    if result is None:
        return "admission, refused" if admission else "step, refused"
    if admission:
        return "admission"
    takes = result.get_block_ids(allow_none=True) is not None
    fills = (computed + num_new_tokens) // block_size > computed // block_size
    if takes:
        return "step that takes and fills a block" if fills else "step that takes a block"
    return "step that fills a block" if fills else "step, nothing taken or filled"


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


__all__ = ["ManagerClock", "allocate_kind"]
