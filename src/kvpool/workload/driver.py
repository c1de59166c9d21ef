"""Replay a trace through one block pool, exactly as a scheduler drives it; time the pool.

The driver is a small FCFS scheduler over a single full-attention KV cache group (group 0,
``hash_block_size == block_size``). It drives the pool through the batch verbs of
:mod:`kvpool.workload.verbs` — one call per step, one per admission attempt — so every
backend sees the same calls and must make the same decisions. Each step runs three phases:

1. **Decode.** Every running request appends its next generated token (one per step). A
   token that starts a new block needs a block: all of this step's needs are served by one
   allocation of ``k`` blocks, handed out in running order. A token that fills a block gets
   the block hashed and cached, as vLLM caches blocks as they fill.
2. **Finish.** A request that generated ``output_len`` tokens frees its table in *reverse*
   order (tail first, so the least reusable block is evicted first), one ``free_blocks``
   per request.
3. **Admit.** Waiting requests, in arrival order, up to ``max_running`` running. For the
   head of the queue: hash its prompt (once), find the longest run of cached blocks over
   its first ``(prompt_len - 1) // block_size`` blocks (the last prompt token is always
   recomputed, as in vLLM, so a fully cached prompt still computes its last block), and
   admit it only if its whole sequence fits: new prompt blocks + hits that are currently
   evictable (free, cached) + future decode blocks + the decode blocks already promised to
   running requests must not exceed the free count. Otherwise it waits, and so does
   everything behind it (FCFS head-of-line blocking); no preemption is needed because
   decode blocks are reserved at admission. An admitted request touches its hits, allocates
   the rest of its prompt blocks (evicting least recently freed cached blocks on the way,
   lazily, inside the allocation) and caches its full prompt blocks.

Phases 1 and 2 are one :func:`~kvpool.batch.step` call: cache the filled blocks, allocate,
free the finished tables. Caching before allocating leaves the same state as the other way
round (the blocks being cached are held, the allocation takes free ones); only the order of
events differs. When a request's new block is also one the same step caches or frees
(``block_size == 1``, or a request whose last token starts a block) the step is split in
two calls, allocation first. Phase 3 is one :func:`~kvpool.batch.admit` per attempt.

The driver keeps two mirrors of its own making: how many running requests hold each block
and which blocks it has cached since their last allocation. A block handed out by an
allocation that was cached is an **eviction**: its key left the prefix cache. Only
allocation removes keys here, so this count equals the number of ``BlockRemoved`` events (a
test checks that). Block tables are int64 arrays sized for the whole sequence, so that the
pool reads them without converting element by element.

**Time.** ``pool_s`` sums ``perf_counter`` deltas around each pool call (including two timer
reads per call; a batch verb is one call); ``wall_s`` is the whole replay, hashing and
bookkeeping included. Neither includes building the pool.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvpool.errors import InvalidConfig
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import Request
from kvpool.workload.tokens import output_tokens
from kvpool.workload.trace import TraceRequest, check_unique_ids
from kvpool.workload.verbs import GROUP_IDS, admit_verb, step_verb

HASH_SEED = "kvpool-replay"
"""Explicit NONE_HASH seed: replays never read the environment and never warn."""


@dataclass(frozen=True)
class SimulationReport:
    """What a replay did and how long the pool took (see :mod:`kvpool.workload.driver`).

    ``hit_rate`` is ``hit_tokens / prompt_tokens``; ``peak_usage`` the largest
    ``pool.get_usage()`` seen after a step (cached free blocks count as free).
    ``verb_calls`` and ``verb_s`` split ``pool_calls`` and ``pool_s`` by verb (``admit``,
    ``step``, ``get_usage``).
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

    TIMING_FIELDS = ("pool_s", "wall_s", "warmup_s", "verb_s")
    JSON_FIELDS = (
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
    """A running request: its hashes, block table (``table[:length]``) and decode progress."""

    __slots__ = ("generated", "length", "num_cached", "output_len", "outputs", "request",
                 "table")

    def __init__(self, request: Request, table: np.ndarray, length: int, num_cached: int,
                 output_len: int):
        self.request = request
        self.table = table
        self.length = length
        self.num_cached = num_cached
        self.output_len = output_len
        self.outputs = output_tokens(request.request_id, output_len)
        self.generated = 0

    def blocks(self) -> np.ndarray:
        return self.table[: self.length]


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
    )


class _Driver:
    """The scheduler loop and its counters (one replay)."""

    def __init__(self, pool: Any, block_size: int, max_running: int, block_hasher: Any) -> None:
        self.pool = pool
        self.bs = block_size
        self.max_running = max_running
        self.block_hasher = block_hasher
        self.caching = bool(pool.enable_caching)
        self.admit = admit_verb(pool)
        self.step = step_verb(pool)
        self.held = [0] * pool.num_gpu_blocks  # running requests holding each block
        self.keyed = bytearray(pool.num_gpu_blocks)  # cached by us since last allocated
        self.reserved = 0  # decode blocks promised to running requests, not yet allocated
        self.running: list[_Running] = []
        self.requests = self.prompt_tokens = self.hit_tokens = 0
        self.evictions = self.blocks_allocated = self.decode_tokens = 0
        self.steps = self.pool_calls = 0
        self.pool_s = 0.0
        self.peak_usage = 0.0
        self.verb_calls: dict[str, int] = {}
        self.verb_s: dict[str, float] = {}
        self.on_step: Callable[[], None] | None = None

    # Every pool call goes through here, so pool_s covers exactly the pool.
    def _call(self, verb: str, method: Callable[..., Any], *args: Any) -> Any:
        began = time.perf_counter()
        result = method(*args)
        elapsed = time.perf_counter() - began
        self.pool_s += elapsed
        self.pool_calls += 1
        self.verb_calls[verb] = self.verb_calls.get(verb, 0) + 1
        self.verb_s[verb] = self.verb_s.get(verb, 0.0) + elapsed
        return result

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
            changed = self._decode_and_finish()
            changed = self._admit(waiting) or changed
            if changed:
                usage = self._call("get_usage", self.pool.get_usage)
                self.peak_usage = max(self.peak_usage, usage)
            if self.on_step is not None:
                self.on_step()
            step += 1
            self.steps += 1

    def _decode_and_finish(self) -> bool:
        """Phases 1 and 2 (see the module docstring); whether anything was allocated."""
        bs = self.bs
        need: list[_Running] = []
        filled: list[_Running] = []
        finished: list[_Running] = []
        still: list[_Running] = []
        split = bs == 1  # a block that fills as it starts is cached after its allocation
        for entry in self.running:
            if entry.generated < entry.output_len:
                request = entry.request
                position = request.num_tokens  # where the new token's KV goes
                request.output_token_ids.append(entry.outputs[entry.generated])
                entry.generated += 1
                self.decode_tokens += 1
                if position % bs == 0:
                    need.append(entry)
                    split = split or entry.generated == entry.output_len
                if (position + 1) % bs == 0:
                    filled.append(entry)
            (finished if entry.generated == entry.output_len else still).append(entry)
        self.running = still
        if not (need or filled or finished):
            return False
        allocated = bool(need)
        if split and need:
            self._hand_out(need, self._call("step", self.step, (), len(need), (), bs,
                                            GROUP_IDS[0]))
            need = []
        items = []
        if self.caching:
            for entry in filled:
                request = entry.request
                request.block_hashes.extend(self.block_hasher(request))
                num_full = len(request.block_hashes)
                if num_full > entry.num_cached:  # else the pool would do nothing
                    items.append((entry, num_full))
        if items or need or finished:
            new = self._call(
                "step", self.step,
                [(e.request, e.blocks(), e.num_cached, num_full) for e, num_full in items],
                len(need), [e.blocks() for e in finished], bs, GROUP_IDS[0],
            )
            self._hand_out(need, new)
        for entry, num_full in items:
            self._cached(entry, num_full)
        held = self.held
        for entry in finished:
            for b in entry.blocks().tolist():
                held[b] -= 1
        return allocated

    def _hand_out(self, need: list[_Running], blocks: list[int]) -> None:
        """Decode blocks, one per needing request in running order."""
        for entry, block in zip(need, blocks, strict=True):
            entry.table[entry.length] = block
            entry.length += 1
        self.reserved -= len(need)
        self._allocated(blocks)

    def _admit(self, waiting: deque[tuple[TraceRequest, Request | None]]) -> bool:
        admitted = False
        bs = self.bs
        while waiting and len(self.running) < self.max_running:
            spec, request = waiting[0]
            if request is None:
                request = Request(spec.id, list(spec.prompt))
                if self.caching:
                    request.block_hashes.extend(self.block_hasher(request))
                waiting[0] = (spec, request)
            prompt_len = len(spec.prompt)
            prompt_blocks = _cdiv(prompt_len, bs)
            total_blocks = _cdiv(prompt_len + spec.output_len, bs)
            future = total_blocks - prompt_blocks
            # At most (prompt_len - 1) // bs hits: the last prompt token is recomputed.
            max_hit = (prompt_len - 1) // bs if self.caching else 0
            num_full = prompt_len // bs if self.caching else 0
            admitted_blocks = self._call("admit", self.admit, request, max_hit, prompt_blocks,
                                         num_full, future + self.reserved, bs, GROUP_IDS[0])
            if admitted_blocks is None:
                if not self.running:
                    # replay() checked every request fits an empty pool; an empty pool that
                    # does not admit the head would loop for ever.
                    raise AssertionError(f"request {spec.id!r} does not fit an idle pool")
                break
            waiting.popleft()
            hits, new = admitted_blocks
            for b in hits:
                self.held[b] += 1
            self._allocated(new)
            table = np.empty(total_blocks, np.int64)
            table[: len(hits)] = hits
            table[len(hits) : prompt_blocks] = new
            entry = _Running(request, table, prompt_blocks, len(hits), spec.output_len)
            if self.caching:
                self._cached(entry, num_full)
            self.reserved += future
            self.running.append(entry)
            self.requests += 1
            self.prompt_tokens += prompt_len
            self.hit_tokens += len(hits) * bs
            admitted = True
        return admitted


__all__ = ["HASH_SEED", "SimulationReport", "replay"]
