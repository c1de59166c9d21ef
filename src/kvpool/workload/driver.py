"""Replay a trace through one block pool, exactly as vLLM's scheduler drives it; time the pool.

The driver is a small FCFS scheduler over a single full-attention KV cache group (group 0,
``hash_block_size == block_size``). It drives the pool through the batch verbs of
:mod:`kvpool.workload.verbs` — one call per step, one per admission attempt — so every
backend sees the same calls and must make the same decisions. It makes the decisions of
vLLM's scheduler on the same trace (the kit's ``bench.py`` replay: same blocks allocated,
hits, evictions and step count). Each step runs two phases, in vLLM's order:

1. **Admit.** Waiting requests, in arrival order, up to ``max_running`` running. For the
   head of the queue: hash its prompt (once), find the longest run of cached blocks over
   its first ``(prompt_len - 1) // block_size`` blocks (the last prompt token is always
   recomputed, as in vLLM, so a fully cached prompt still computes its last block), and
   admit it only if its whole sequence fits: new prompt blocks + hits that are currently
   evictable (free, cached) + future decode blocks + the decode blocks already promised to
   running requests must not exceed the free count. Otherwise it waits, and so does
   everything behind it (FCFS head-of-line blocking); no preemption is needed because
   decode blocks are reserved at admission (``cdiv(prompt + output_len, bs) -
   cdiv(prompt, bs)`` of them). An admitted request touches its hits, allocates the rest of
   its prompt blocks (evicting least recently freed cached blocks on the way, lazily, inside
   the allocation) and caches its full prompt blocks. Its prefill samples its first output
   token.
2. **Decode and finish.** Every running request, newly admitted ones included, in running
   order: one that has sampled all its ``output_len`` tokens frees its table in *reverse*
   order (tail first, so the least reusable block is evicted first) and returns the decode
   blocks it was promised but never used. Every other one computes the KV of its last
   sampled token and samples the next. That token needs a new block when it starts one
   (all of this step's needs are served by one allocation, handed out in running order) and
   gets its block hashed and cached when it fills one, as vLLM caches blocks as they fill.
   The last sampled token is never computed: a request of ``output_len`` tokens writes KV
   for ``prompt_len + output_len - 1`` of them.

Phase 2 is usually one :func:`~kvpool.batch.step` call: cache the filled blocks, allocate,
free the finished tables. Caching before allocating leaves the same state as the other way
round (the blocks being cached are held by their request alone, the allocation takes free
ones); only the order of events differs. Allocation and release do not commute: a table's
unkeyed blocks go to the queue's front, where vLLM's loop hands them to a request later in
running order. So a need that follows a finish in running order starts a new ``step`` call
(one call per run of needs and finishes; with one ``output_len`` for all, finishers are
contiguous and a step takes at most two calls). With ``block_size == 1`` a block fills as it
starts, so the filled blocks are cached in a last call of their own, after the allocation.
Phase 1 is one :func:`~kvpool.batch.admit_into` per attempt: the admission writes the hits
and new blocks straight into the request's table array.

The driver keeps two mirrors of its own making: how many running requests hold each block
and which blocks it has cached since their last allocation. A block handed out by an
allocation that was cached is an **eviction**: its key left the prefix cache. Only
allocation removes keys here, so this count equals the number of ``BlockRemoved`` events (a
test checks that). Block tables are int64 arrays sized for the whole sequence, so that the
pool reads them without converting element by element.

**Time.** ``pool_s`` sums ``perf_counter`` deltas around each pool call (including two timer
reads per call; a batch verb is one call); ``pool_cpu_s`` the same with ``thread_time``;
``wall_s`` is the whole replay, hashing and bookkeeping included, and ``hash_s`` (CPU:
``hash_cpu_s``) the part of it spent building requests and hashing blocks (as the vLLM kit
times it: a request hashes its prompt's full blocks as it is built, from the tokens it has
just checked). None includes building the pool.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, cast

import numpy as np

from kvpool.errors import InvalidConfig
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import Request
from kvpool.workload.timing import TimedCalls
from kvpool.workload.tokens import output_tokens
from kvpool.workload.trace import TraceRequest, check_unique_ids
from kvpool.workload.verbs import GROUP_IDS, admit_into_verb, step_verb

HASH_SEED = "kvpool-replay"
"""Explicit NONE_HASH seed: replays never read the environment and never warn."""


@dataclass(frozen=True)
class SimulationReport:
    """What a replay did and how long the pool took (see :mod:`kvpool.workload.driver`).

    ``hit_rate`` is ``hit_tokens / prompt_tokens``; ``peak_usage`` the largest
    ``pool.get_usage()`` seen after a step (cached free blocks count as free).
    ``decode_tokens`` counts sampled output tokens (each request's last one is never
    computed). ``verb_calls`` and ``verb_s`` split ``pool_calls`` and ``pool_s`` by verb
    (``admit``, ``step``, ``get_usage``). ``pool_cpu_s`` is ``pool_s`` on the thread's CPU
    clock (``time.thread_time``), ``hash_s`` (``hash_cpu_s``) the wall (CPU) time spent
    hashing blocks.
    """

    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float
    evictions: int
    peak_usage: float
    pool_s: float
    wall_s: float
    blocks_allocated: int
    backend: str = ""
    num_blocks: int = 0
    block_size: int = 0
    max_running: int = 0
    steps: int = 0
    decode_tokens: int = 0
    pool_calls: int = 0
    warmup_s: float = 0.0
    verb_calls: dict[str, int] = field(default_factory=dict)
    verb_s: dict[str, float] = field(default_factory=dict)
    pool_cpu_s: float = 0.0
    hash_s: float = 0.0
    hash_cpu_s: float = 0.0

    TIMING_FIELDS = ("pool_s", "wall_s", "warmup_s", "verb_s", "pool_cpu_s", "hash_s",
                     "hash_cpu_s")
    JSON_FIELDS: ClassVar[tuple[str, ...]] = (
        "requests",
        "prompt_tokens",
        "hit_tokens",
        "hit_rate",
        "evictions",
        "peak_usage",
        "pool_s",
        "wall_s",
    )

    def decisions(self) -> dict[str, Any]:
        """Every field that must not depend on the backend (all but timings and its name)."""
        values = asdict(self)
        for name in (*self.TIMING_FIELDS, "backend"):
            del values[name]
        return values

    def to_dict(self) -> dict[str, Any]:
        """All fields as a JSON-ready dict, the documented ``--json`` keys first."""
        values = asdict(self)
        ordered = {name: values.pop(name) for name in self.JSON_FIELDS}
        ordered.update(values)
        return ordered


class _Running:
    """A running request: its hashes, block table (``table[:length]``), decode progress
    (``position``: the KV slot of its last sampled token, ``request.num_tokens - 1``) and the
    decode blocks still promised to it (``owed``)."""

    __slots__ = ("generated", "length", "num_cached", "output_len", "outputs", "owed",
                 "position", "request", "table")

    def __init__(self, request: Request, table: np.ndarray, length: int, num_cached: int,
                 output_len: int, owed: int):
        self.request = request
        self.table = table
        self.length = length
        self.num_cached = num_cached
        self.output_len = output_len
        self.outputs = output_tokens(request.request_id, output_len)
        self.owed = owed
        self.generated = 0
        self.position = request.num_tokens - 1

    def blocks(self) -> np.ndarray:
        return self.table[: self.length]

    def sample(self) -> None:
        """Append the next output token (the KV of the previous one was just computed)."""
        self.request.output_token_ids.append(self.outputs[self.generated])
        self.generated += 1
        self.position += 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def replay(
    pool: Any,
    trace: Sequence[TraceRequest],
    *,
    block_size: int = 16,
    max_running: int = 64,
    hasher: BlockHasher | None = None,
    backend: str | None = None,
    on_step: Callable[[], None] | None = None,
) -> SimulationReport:
    """Replay ``trace`` through ``pool`` (see the module docstring); the report.

    ``on_step``, if given, is called after every scheduler step, outside the pool's time (a
    KV event publisher takes the step's events there, as vLLM's scheduler does). ``pool``
    should be fresh: the driver assumes it is the pool's only user. Raises
    :class:`InvalidConfig` if ``pool.hash_block_size != block_size``, if ``max_running < 1``
    or if some request could never fit (its whole sequence needs more than ``N - 1`` blocks).
    """
    if block_size != pool.hash_block_size:
        raise InvalidConfig(
            f"block_size {block_size} must equal the pool's hash_block_size "
            f"{pool.hash_block_size} (one group, hashes at block granularity)"
        )
    if max_running < 1:
        raise InvalidConfig(f"max_running must be >= 1, got {max_running}")
    check_unique_ids(trace)
    capacity = pool.num_gpu_blocks - 1
    for request in trace:
        need = _cdiv(len(request.prompt) + request.output_len, block_size)
        if need > capacity:
            raise InvalidConfig(
                f"request {request.id!r} needs {need} blocks of {block_size} tokens; "
                f"the pool has {capacity} usable blocks"
            )
    hasher = hasher or BlockHasher("sha256", seed=HASH_SEED)
    driver = _Driver(pool, block_size, max_running, get_request_block_hasher(block_size, hasher))
    driver.on_step = on_step
    began = time.perf_counter()
    driver.run(sorted(trace, key=lambda r: r.arrival_step))
    wall_s = time.perf_counter() - began
    s = driver
    return SimulationReport(
        requests=s.requests,
        prompt_tokens=s.prompt_tokens,
        hit_tokens=s.hit_tokens,
        hit_rate=s.hit_tokens / s.prompt_tokens if s.prompt_tokens else 0.0,
        evictions=s.evictions,
        peak_usage=s.peak_usage,
        pool_s=s.pool_s,
        wall_s=wall_s,
        blocks_allocated=s.blocks_allocated,
        backend=str(backend or getattr(pool, "backend_name", type(pool).__name__)),
        num_blocks=pool.num_gpu_blocks,
        block_size=block_size,
        max_running=max_running,
        steps=s.steps,
        decode_tokens=s.decode_tokens,
        pool_calls=s.pool_calls,
        verb_calls=dict(s.verb_calls),
        verb_s=dict(s.verb_s),
        pool_cpu_s=s.pool_cpu_s,
        hash_s=s.hash_s,
        hash_cpu_s=s.hash_cpu_s,
    )


class _Driver(TimedCalls):
    """The scheduler loop and its counters (one replay)."""

    def __init__(self, pool: Any, block_size: int, max_running: int, block_hasher: Any) -> None:
        self.pool = pool
        self.bs = block_size
        self.max_running = max_running
        self.block_hasher = block_hasher
        self.caching = bool(pool.enable_caching)
        self.admit = admit_into_verb(pool)
        self.step = step_verb(pool)
        self.held = [0] * pool.num_gpu_blocks  # running requests holding each block
        self.keyed = bytearray(pool.num_gpu_blocks)  # cached by us since last allocated
        self.reserved = 0  # decode blocks promised to running requests, not yet allocated
        self.running: list[_Running] = []
        self.requests = self.prompt_tokens = self.hit_tokens = 0
        self.evictions = self.blocks_allocated = self.decode_tokens = 0
        self.steps = 0
        self._reset_timing()  # every pool call goes through _call: pool_s is exactly the pool
        self.hash_s = self.hash_cpu_s = 0.0
        self.peak_usage = 0.0
        self.on_step: Callable[[], None] | None = None

    def _hash_new_blocks(self, request: Request) -> None:
        cpu = time.thread_time()
        began = time.perf_counter()
        request.block_hashes.extend(self.block_hasher(request))
        self.hash_s += time.perf_counter() - began
        self.hash_cpu_s += time.thread_time() - cpu

    def _new_request(self, spec: TraceRequest) -> Request:
        """A trace request's :class:`Request`; with caching on, its prompt's full blocks are
        hashed as it is built (the raw hash modes then reuse the packing that checked the
        tokens), and later blocks by :meth:`_hash_new_blocks`, once computed."""
        if not self.caching:
            # The Request checks the tokens and makes its own list (of any sequence).
            return Request(spec.id, cast(list[int], spec.prompt))
        cpu = time.thread_time()
        began = time.perf_counter()
        request = Request(spec.id, cast(list[int], spec.prompt), block_hasher=self.block_hasher)
        request.block_hasher = None  # a sampled token must not hash the block it fills
        self.hash_s += time.perf_counter() - began
        self.hash_cpu_s += time.thread_time() - cpu
        return request

    def _allocated(self, blocks: list[int]) -> None:
        keyed, held = self.keyed, self.held
        for b in blocks:
            if keyed[b]:
                self.evictions += 1
                keyed[b] = 0
            held[b] = 1
        self.blocks_allocated += len(blocks)

    def _cached(self, entry: _Running, num_full: int) -> None:
        for b in entry.table[entry.num_cached : num_full].tolist():
            self.keyed[b] = 1
        entry.num_cached = max(entry.num_cached, num_full)

    def run(self, trace: Sequence[TraceRequest]) -> None:
        pending = deque(trace)
        waiting: deque[tuple[TraceRequest, Request | None]] = deque()
        step = 0
        while pending or waiting or self.running:
            if not waiting and not self.running and pending[0].arrival_step > step:
                step = pending[0].arrival_step  # nothing to do until the next arrival
            while pending and pending[0].arrival_step <= step:
                waiting.append((pending.popleft(), None))
            changed = self._admit(waiting)
            changed = self._decode_and_finish() or changed
            if changed:
                usage = self._call("get_usage", self.pool.get_usage)
                self.peak_usage = max(self.peak_usage, usage)
            if self.on_step is not None:
                self.on_step()
            step += 1
            self.steps += 1

    def _decode_and_finish(self) -> bool:
        """Phase 2 (see the module docstring); whether anything was allocated."""
        bs = self.bs
        # Runs of (needing requests, finished requests) in running order: a need that comes
        # after a finish must see that finish's frees (its unkeyed blocks go to the front).
        segments: list[tuple[list[_Running], list[_Running]]] = [([], [])]
        filled: list[_Running] = []
        still: list[_Running] = []
        for entry in self.running:
            if entry.generated >= entry.output_len:
                segments[-1][1].append(entry)
                continue
            offset = entry.position % bs  # where the last sampled token's KV goes
            if offset == 0:
                if segments[-1][1]:
                    segments.append(([], []))
                segments[-1][0].append(entry)
            if offset == bs - 1:
                filled.append(entry)
            still.append(entry)
        self.running = still
        self._step_calls(segments, filled)
        for entry in still:
            entry.sample()  # after hashing: a filled block holds only computed tokens
        self.decode_tokens += len(still)
        return any(need for need, _ in segments)

    def _step_calls(self, segments: list[tuple[list[_Running], list[_Running]]],
                    filled: list[_Running]) -> None:
        """One ``step`` call per segment (usually one per step), the filled blocks cached in
        the first; with ``block_size == 1`` a block fills as it starts, so they are cached
        in a call of their own after every allocation."""
        bs = self.bs
        items = []
        if self.caching:
            for entry in filled:
                request = entry.request
                self._hash_new_blocks(request)
                num_full = len(request.block_hashes)
                if num_full > entry.num_cached:  # else the pool would do nothing
                    items.append((entry, num_full))
        cache_last = bs == 1
        if cache_last:
            segments = [*segments, ([], [])]
        for i, (need, finished) in enumerate(segments):
            cache = items if i == (len(segments) - 1 if cache_last else 0) else ()
            if not (cache or need or finished):
                continue
            new = self._call(
                "step", self.step,
                [(e.request, e.blocks(), e.num_cached, num_full) for e, num_full in cache],
                len(need), [e.blocks() for e in finished], bs, GROUP_IDS[0],
            )
            self._hand_out(need, new)
            held = self.held
            for entry in finished:
                self.reserved -= entry.owed  # promised decode blocks it never needed
                for b in entry.blocks().tolist():
                    held[b] -= 1
        for entry, num_full in items:
            self._cached(entry, num_full)

    def _hand_out(self, need: list[_Running], blocks: list[int]) -> None:
        """Decode blocks, one per needing request in running order."""
        for entry, block in zip(need, blocks, strict=True):
            entry.table[entry.length] = block
            entry.length += 1
            entry.owed -= 1
        self.reserved -= len(need)
        self._allocated(blocks)

    def _admit(self, waiting: deque[tuple[TraceRequest, Request | None]]) -> bool:
        admitted = False
        bs = self.bs
        while waiting and len(self.running) < self.max_running:
            spec, request = waiting[0]
            if request is None:
                request = self._new_request(spec)
                waiting[0] = (spec, request)
            prompt_len = len(spec.prompt)
            prompt_blocks = _cdiv(prompt_len, bs)
            total_blocks = _cdiv(prompt_len + spec.output_len, bs)
            future = total_blocks - prompt_blocks
            # At most (prompt_len - 1) // bs hits: the last prompt token is recomputed.
            max_hit = (prompt_len - 1) // bs if self.caching else 0
            num_full = prompt_len // bs if self.caching else 0
            table = np.empty(total_blocks, np.int64)
            num_hits = self._call("admit", self.admit, request, table, max_hit, prompt_blocks,
                                  num_full, future + self.reserved, bs, GROUP_IDS[0])
            if num_hits is None:
                if not self.running:
                    # replay() checked every request fits an empty pool; an empty pool that
                    # does not admit the head would loop for ever.
                    raise AssertionError(f"request {spec.id!r} does not fit an idle pool")
                break
            waiting.popleft()
            held = self.held
            for b in table[:num_hits].tolist():
                held[b] += 1
            self._allocated(table[num_hits:prompt_blocks].tolist())
            entry = _Running(request, table, prompt_blocks, num_hits, spec.output_len, future)
            if self.caching:
                self._cached(entry, num_full)
            self.reserved += future
            if spec.output_len:
                entry.sample()  # the prefill samples the first output token
                self.decode_tokens += 1
            self.running.append(entry)
            self.requests += 1
            self.prompt_tokens += prompt_len
            self.hit_tokens += num_hits * bs
            admitted = True
        return admitted


__all__ = ["HASH_SEED", "SimulationReport", "replay"]
