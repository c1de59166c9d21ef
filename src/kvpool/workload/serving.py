"""Replay a trace through a :class:`~kvpool.policy.KVCacheManager`, as vLLM's scheduler does.

This is the driver behind ``kvpool simulate``. It talks to the KV cache manager only —
``get_computed_blocks``, ``allocate_slots``, ``free``, ``take_events``, ``usage`` — so any
model shape (:mod:`kvpool.workload.models`) and any backend run the same scheduler. Each
step, in vLLM's order:

1. **Admit.** Waiting requests, first come first served, while fewer than ``max_running``
   run. The head's prefix hits come from ``get_computed_blocks`` (never its last token); it
   is admitted by ``allocate_slots`` for the rest of its tokens with ``reserved_blocks`` =
   the full-attention decode blocks promised to running requests plus its own (``cdiv(prompt
   + output_len, bs) - cdiv(prompt, bs)`` per full-attention group). ``None`` means it does
   not fit: it waits, and so does everyone behind it (head-of-line blocking). The prefill
   samples the first output token.
2. **Decode and finish**, in running order. A request that has sampled all its tokens is
   freed (tail first, group by group). Every other one gets ``allocate_slots(request, 1)``
   for the KV of its last sampled token (the facade keys each block as it fills), then
   samples the next. The last sampled token is never computed. If a decode allocation does
   not fit — the reservation covers full attention only; a hybrid's other groups can
   still run short — the *last* running request is **preempted** (freed, its computed
   tokens forgotten, back to the front of the queue) and the allocation retried, as vLLM's
   scheduler does; a request that is itself the last preempts itself.

vLLM's scheduler calls ``allocate_slots`` for every running request every step. On a
model of full-attention groups only, most of those calls change nothing: a token whose KV
slot neither starts a block (``position % bs == 0``) nor fills one (``(position + 1) % bs
== 0``) allocates, caches and frees nothing. With ``skip_idle_decode`` (the default) the
driver leaves those calls out there — about ``(bs - 2) / bs`` of all decode calls — and
``tests/workload/test_serving.py`` checks that the decisions and every step's series are
the same as with every call made. Sliding-window and Mamba groups free and move blocks at
other positions, so a hybrid model gets every call.

With one full-attention group this makes the decisions of the bare-pool driver
(:mod:`kvpool.workload.driver`) and so of vLLM's on the kit's trace: same blocks allocated,
hits, evictions and steps (``tests/workload/test_vllm_decisions.py``).

**Evictions** are counted from the pool's own events: each ``BlockRemoved`` hash is a key
that left the prefix cache because its block was reallocated (nothing else removes keys
here). So events are on; the step's events are handed to ``on_events`` when given (a
publisher), outside the timed calls.

**Time.** ``pool_s`` (``pool_cpu_s``) sums ``perf_counter`` (``thread_time``) around each
manager call; ``wall_s`` is the whole replay, hashing and scheduling included.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.events import BlockRemoved
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import KVCacheManager, RequestStatus, SchedulerRequest
from kvpool.workload.driver import HASH_SEED, SimulationReport
from kvpool.workload.models import full_attention_groups
from kvpool.workload.timing import TimedCalls
from kvpool.workload.tokens import output_tokens
from kvpool.workload.trace import TraceRequest, check_unique_ids


@dataclass(frozen=True)
class StepSeries:
    """One value per scheduler step: what ``--plot`` draws."""

    usage: list[float] = field(default_factory=list)
    hit_rate: list[float] = field(default_factory=list)  # cumulative, of admitted prompts
    evictions: list[int] = field(default_factory=list)  # in that step
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ServingReport(SimulationReport):
    """A :class:`SimulationReport` of a replay through the KV cache manager, plus
    ``preemptions``, ``mean_usage`` (over steps), the model and workload names, and the
    per-step series (``series``)."""

    preemptions: int = 0
    mean_usage: float = 0.0
    model: str = "full"
    workload: str = ""
    #: Which policy made the decisions: "fast" (kvpool.policy.fast) or "generic".
    policy: str = "generic"
    series: StepSeries = field(default_factory=StepSeries, compare=False, repr=False)

    JSON_FIELDS = (
        "requests",
        "prompt_tokens",
        "hit_tokens",
        "hit_rate",
        "evictions",
        "preemptions",
        "peak_usage",
        "mean_usage",
        "pool_s",
        "wall_s",
    )

    def summary(self) -> dict[str, Any]:
        """Exactly the documented ``--json`` keys."""
        return {name: getattr(self, name) for name in self.JSON_FIELDS}

    def decisions(self) -> dict[str, Any]:
        values = super().decisions()
        del values["series"], values["workload"], values["policy"]  # not decisions
        return values


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Live:
    """A request the scheduler knows: its facade request, decode progress and the
    full-attention decode blocks still promised to it (``owed``)."""

    __slots__ = ("generated", "outputs", "owed", "prompt_len", "request", "spec")

    def __init__(self, spec: TraceRequest, request: SchedulerRequest) -> None:
        self.spec = spec
        self.request = request
        self.outputs = output_tokens(spec.id, spec.output_len)
        self.owed = 0
        self.prompt_len = len(spec.prompt)
        self.generated = 0  # output tokens sampled (the request holds them)

    def sample(self) -> None:
        self.request.append_output_token_ids(self.outputs[self.generated])
        self.generated += 1


def check_fits(trace: Sequence[TraceRequest], manager: KVCacheManager, block_size: int) -> None:
    """Raise :class:`InvalidConfig` naming the first request whose full-attention blocks
    alone exceed the pool (it could never run)."""
    full = len(full_attention_groups(manager.kv_cache_config.kv_cache_groups))
    capacity = manager.block_pool.num_gpu_blocks - 1
    for request in trace:
        need = full * _cdiv(len(request.prompt) + request.output_len, block_size)
        if need > capacity:
            raise InvalidConfig(
                f"request {request.id!r} needs {need} blocks of {block_size} tokens; "
                f"the pool has {capacity} usable blocks (raise --num-blocks)")


def serve(
    manager: KVCacheManager,
    trace: Sequence[TraceRequest],
    *,
    block_size: int,
    max_running: int = 64,
    hasher: BlockHasher | None = None,
    backend: str = "",
    model: str = "full",
    workload: str = "",
    on_events: Callable[[list[Any]], None] | None = None,
    on_step: Callable[[int], None] | None = None,
    skip_idle_decode: bool = True,
) -> ServingReport:
    """Replay ``trace`` through ``manager`` (see the module docstring); the report.

    ``manager`` must be fresh, built with ``enable_kv_cache_events=True`` and scheduler and
    hash block size ``block_size``. ``on_step(requests_done)`` is called after every step
    (a progress bar). Raises :class:`InvalidConfig` if ``max_running < 1`` or a request can
    never fit.
    """
    if max_running < 1:
        raise InvalidConfig(f"max_running must be >= 1, got {max_running}")
    check_unique_ids(trace)
    check_fits(trace, manager, block_size)
    hasher = hasher or BlockHasher("sha256", seed=HASH_SEED)
    run = _Scheduler(manager, block_size, max_running,
                     get_request_block_hasher(block_size, hasher), on_events, on_step)
    run.skip_idle_decode = skip_idle_decode
    began = time.perf_counter()
    run.run(sorted(trace, key=lambda r: r.arrival_step))
    wall_s = time.perf_counter() - began
    s = run
    usage = s.series.usage
    return ServingReport(
        requests=s.requests, prompt_tokens=s.prompt_tokens, hit_tokens=s.hit_tokens,
        hit_rate=s.hit_tokens / s.prompt_tokens if s.prompt_tokens else 0.0,
        evictions=s.evictions, peak_usage=max(usage, default=0.0), pool_s=s.pool_s,
        wall_s=wall_s, blocks_allocated=s.blocks_allocated, backend=backend,
        num_blocks=manager.block_pool.num_gpu_blocks, block_size=block_size,
        max_running=max_running, steps=s.steps, decode_tokens=s.decode_tokens,
        pool_calls=s.pool_calls, verb_calls=dict(s.verb_calls), verb_s=dict(s.verb_s),
        pool_cpu_s=s.pool_cpu_s, preemptions=s.preemptions,
        mean_usage=sum(usage) / len(usage) if usage else 0.0, model=model,
        workload=workload, series=s.series, policy=manager.policy_name,
    )


class _Scheduler(TimedCalls):
    """The scheduler loop and its counters (one replay)."""

    def __init__(self, manager: KVCacheManager, block_size: int, max_running: int,
                 block_hasher: Any, on_events: Callable[[list[Any]], None] | None,
                 on_step: Callable[[int], None] | None) -> None:
        self.manager = manager
        self.bs = block_size
        self.max_running = max_running
        self.block_hasher = block_hasher
        self.on_events = on_events
        self.on_step = on_step
        self.full_groups = full_attention_groups(manager.kv_cache_config.kv_cache_groups)
        self.reserved = 0  # full-attention decode blocks promised to running requests
        self.running: list[_Live] = []
        self.requests = self.prompt_tokens = self.hit_tokens = self.finished = 0
        self.evictions = self.blocks_allocated = self.decode_tokens = 0
        self.preemptions = self.steps = 0
        self._reset_timing()
        self.series = StepSeries()
        self.skip_idle_decode = True
        self.only_full = len(self.full_groups) == len(manager.kv_cache_config.kv_cache_groups)
        self.refused_idle = False  # the head was refused by an idle pool last step

    def _future_full_blocks(self, live: _Live) -> int:
        """Full-attention decode blocks the request may still take (the kit's formula)."""
        spec, bs = live.spec, self.bs
        per_group = _cdiv(len(spec.prompt) + spec.output_len, bs) - _cdiv(
            live.request.num_tokens, bs)
        return len(self.full_groups) * max(per_group, 0)

    def _allocated(self, live: _Live, new: Any) -> None:
        blocks = new.blocks
        self.blocks_allocated += sum(len(g) for g in blocks)
        taken = sum(len(blocks[g]) for g in self.full_groups)
        taken = min(taken, live.owed)
        live.owed -= taken
        self.reserved -= taken

    def _release(self, live: _Live) -> None:
        self._call("free", self.manager.free, live.request)
        self.reserved -= live.owed
        live.owed = 0

    def run(self, trace: Sequence[TraceRequest]) -> None:
        pending = deque(trace)
        waiting: deque[_Live | TraceRequest] = deque()
        manager, series = self.manager, self.series
        step = 0
        while pending or waiting or self.running:
            if not waiting and not self.running and pending[0].arrival_step > step:
                step = pending[0].arrival_step  # nothing to do until the next arrival
            while pending and pending[0].arrival_step <= step:
                waiting.append(pending.popleft())
            manager.new_step_starts()
            self._admit(waiting)
            step_evictions = self._decode_and_finish(waiting)
            events = manager.take_events()
            for event in events:
                if type(event) is BlockRemoved:
                    step_evictions += len(event.block_hashes)
            if events and self.on_events is not None:
                self.on_events(events)
            self.evictions += step_evictions
            series.usage.append(self._call("usage", lambda: manager.usage))
            series.hit_rate.append(self.hit_tokens / self.prompt_tokens
                                   if self.prompt_tokens else 0.0)
            series.evictions.append(step_evictions)
            series.running.append(len(self.running))
            series.waiting.append(len(waiting))
            step += 1
            self.steps += 1
            if self.on_step is not None:
                self.on_step(self.finished)

    def _admit(self, waiting: deque[_Live | TraceRequest]) -> None:
        manager = self.manager
        while waiting and len(self.running) < self.max_running:
            head = waiting[0]
            if isinstance(head, TraceRequest):
                head = _Live(head, SchedulerRequest(head.id, list(head.prompt),
                                                    block_hasher=self.block_hasher))
                waiting[0] = head
            request = head.request
            hits, num_hit = self._call("get_computed_blocks", manager.get_computed_blocks,
                                       request)
            own = self._future_full_blocks(head)
            new = self._call("allocate_slots", manager.allocate_slots, request,
                             request.num_tokens - num_hit, num_hit, hits,
                             reserved_blocks=self.reserved + own)
            if new is None:
                if not self.running and self.refused_idle:
                    # Refused twice by an idle pool (once may be a Mamba state cached in
                    # the step before, which a hit must wait one step for): never fits.
                    raise InvalidConfig(
                        f"request {head.spec.id!r} ({request.num_tokens} tokens) does not "
                        f"fit an idle pool of {manager.block_pool.num_gpu_blocks} blocks "
                        "(raise --num-blocks)")
                self.refused_idle = not self.running
                return
            self.refused_idle = False
            waiting.popleft()
            first = request.num_preemptions == 0
            head.owed = own
            self.reserved += own
            self._allocated(head, new)
            request.num_computed_tokens = request.num_tokens
            request.status = RequestStatus.RUNNING
            if first:
                self.requests += 1
                self.prompt_tokens += len(head.spec.prompt)
                self.hit_tokens += num_hit
            if head.generated < head.spec.output_len:
                head.sample()  # the prefill samples the next output token
                self.decode_tokens += 1
            self.running.append(head)

    def _decode_and_finish(self, waiting: deque[_Live | TraceRequest]) -> int:
        """Phase 2 (module docstring); always 0 (evictions come from the events)."""
        manager = self.manager
        running = self.running
        bs, skip = self.bs, self.skip_idle_decode and self.bs > 2 and self.only_full
        kept: list[_Live] = []
        i = 0
        while i < len(running):
            live = running[i]
            i += 1
            request = live.request
            if live.generated >= live.spec.output_len:
                self._release(live)
                self.finished += 1
                continue
            position = live.prompt_len + live.generated - 1  # the last sampled token's slot
            if skip and 0 < position % bs < bs - 1:
                request.num_computed_tokens += 1  # a call would change nothing
                live.sample()
                self.decode_tokens += 1
                kept.append(live)
                continue
            while True:
                new = self._call("allocate_slots", manager.allocate_slots, request, 1)
                if new is not None:
                    break
                victim = running.pop()  # the last running request, vLLM's FCFS choice
                self._preempt(victim, waiting)
                if victim is live:
                    break
            if new is None:
                continue
            self._allocated(live, new)
            request.num_computed_tokens += 1
            live.sample()
            self.decode_tokens += 1
            kept.append(live)
        self.running = kept
        return 0

    def _preempt(self, live: _Live, waiting: deque[_Live | TraceRequest]) -> None:
        self._release(live)
        request = live.request
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        waiting.appendleft(live)
        self.preemptions += 1


__all__ = ["ServingReport", "StepSeries", "check_fits", "serve"]
