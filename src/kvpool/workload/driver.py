"""Replay a trace through one block pool, exactly as a scheduler drives it; time the pool.

The driver is a small FCFS scheduler over a single full-attention KV cache group (group 0,
``hash_block_size == block_size``). It uses only the :class:`~kvpool.protocol.BlockPool`
verbs, so every backend sees the same call sequence and must make the same decisions. Each
step runs three phases, in this order:

1. **Decode.** Every running request appends its next generated token (one per step). A
   token that starts a new block needs a block: all of this step's needs are served by one
   ``get_new_blocks(k)``, handed out in running order (the same blocks, in the same order, as
   ``k`` single calls would give: nothing is freed in between). A token that fills a block
   gets the block hashed and cached (``cache_full_blocks``), as vLLM caches blocks as they
   fill.
2. **Finish.** A request that generated ``output_len`` tokens frees its table in *reverse*
   order (tail first, so the least reusable block is evicted first), one call per request.
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
   lazily, inside ``get_new_blocks``) and caches its full prompt blocks (one
   ``allocate_and_cache``).

The driver keeps two mirrors of its own making: how many running requests hold each block
(to tell evictable hits from held ones without reading pool internals) and which blocks it
has cached since their last allocation. A block handed out by ``get_new_blocks`` that was
cached is an **eviction**: its key left the prefix cache. Only allocation removes keys here,
so this count equals the number of ``BlockRemoved`` events (a test checks that).

**Time.** ``pool_s`` sums ``perf_counter`` deltas around each pool call (including two timer
reads per call); ``wall_s`` is the whole replay, hashing and bookkeeping included. Neither
includes building the pool.

A new request's hit lookup and its allocate-then-cache are the batch verbs of
:mod:`kvpool.workload.verbs`: one method call on pools that offer them (fast), the
:mod:`kvpool.batch` composition of protocol verbs otherwise. The decisions are the same;
each batch verb counts as one pool call.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import Request
from kvpool.workload.tokens import output_tokens
from kvpool.workload.trace import TraceRequest, check_unique_ids
from kvpool.workload.verbs import GROUP_IDS, allocate_and_cache_verb, longest_cache_hit_verb

HASH_SEED = "kvpool-replay"
"""Explicit NONE_HASH seed: replays never read the environment and never warn."""


@dataclass(frozen=True)
class SimulationReport:
    """What a replay did and how long the pool took (see :mod:`kvpool.workload.driver`).

    ``hit_rate`` is ``hit_tokens / prompt_tokens``; ``peak_usage`` the largest
    ``pool.get_usage()`` seen after a step (cached free blocks count as free).
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

    TIMING_FIELDS = ("pool_s", "wall_s", "warmup_s")
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
    """A running request: its hashes, block table and decode progress."""

    __slots__ = ("generated", "num_cached", "output_len", "outputs", "request", "table")

    def __init__(self, request: Request, table: list[int], num_cached: int, output_len: int):
        self.request = request
        self.table = table
        self.num_cached = num_cached
        self.output_len = output_len
        self.outputs = output_tokens(request.request_id, output_len)
        self.generated = 0


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
) -> SimulationReport:
    """Replay ``trace`` through ``pool`` (see the module docstring); the report.

    ``pool`` should be fresh: the driver assumes it is the pool's only user. Raises
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
    )


class _Driver:
    """The scheduler loop and its counters (one replay)."""

    def __init__(self, pool: Any, block_size: int, max_running: int, block_hasher: Any) -> None:
        self.pool = pool
        self.bs = block_size
        self.max_running = max_running
        self.block_hasher = block_hasher
        self.caching = bool(pool.enable_caching)
        self.longest_hit = longest_cache_hit_verb(pool)
        self.allocate_and_cache = allocate_and_cache_verb(pool)
        self.held = [0] * pool.num_gpu_blocks  # running requests holding each block
        self.keyed = bytearray(pool.num_gpu_blocks)  # cached by us since last allocated
        self.reserved = 0  # decode blocks promised to running requests, not yet allocated
        self.running: list[_Running] = []
        self.requests = self.prompt_tokens = self.hit_tokens = 0
        self.evictions = self.blocks_allocated = self.decode_tokens = 0
        self.steps = self.pool_calls = 0
        self.pool_s = 0.0
        self.peak_usage = 0.0

    # Every pool call goes through here, so pool_s covers exactly the pool.
    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        began = time.perf_counter()
        result = method(*args)
        self.pool_s += time.perf_counter() - began
        self.pool_calls += 1
        return result

    def _allocate(self, n: int) -> list[int]:
        blocks = self._call(self.pool.get_new_blocks, n)
        self._allocated(blocks)
        return blocks

    def _allocated(self, blocks: list[int]) -> None:
        keyed, held = self.keyed, self.held
        for b in blocks:
            if keyed[b]:
                self.evictions += 1
                keyed[b] = 0
            held[b] = 1
        self.blocks_allocated += len(blocks)

    def _cache(self, entry: _Running, num_full: int) -> None:
        if num_full <= entry.num_cached:
            return  # the pool would do nothing (a prompt whose full blocks all hit)
        self._call(
            self.pool.cache_full_blocks,
            entry.request, entry.table, entry.num_cached, num_full, self.bs, GROUP_IDS[0],
        )
        self._cached(entry, num_full)

    def _cached(self, entry: _Running, num_full: int) -> None:
        for b in entry.table[entry.num_cached : num_full]:
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
            changed = self._decode()
            self._finish()
            changed = self._admit(waiting) or changed
            if changed:
                self.peak_usage = max(self.peak_usage, self._call(self.pool.get_usage))
            step += 1
            self.steps += 1

    def _decode(self) -> bool:
        bs = self.bs
        need_block: list[_Running] = []
        filled: list[_Running] = []
        for entry in self.running:
            if entry.generated == entry.output_len:
                continue
            request = entry.request
            position = request.num_tokens  # where the new token's KV goes
            request.output_token_ids.append(entry.outputs[entry.generated])
            entry.generated += 1
            self.decode_tokens += 1
            if position % bs == 0:
                need_block.append(entry)
            if (position + 1) % bs == 0:
                filled.append(entry)
        if need_block:
            blocks = self._allocate(len(need_block))
            for entry, block in zip(need_block, blocks, strict=True):
                entry.table.append(block)
            self.reserved -= len(need_block)
        if self.caching:
            for entry in filled:
                request = entry.request
                request.block_hashes.extend(self.block_hasher(request))
                self._cache(entry, len(request.block_hashes))
        return bool(need_block)

    def _finish(self) -> None:
        still: list[_Running] = []
        held = self.held
        for entry in self.running:
            if entry.generated < entry.output_len:
                still.append(entry)
                continue
            table = entry.table
            self._call(self.pool.free_blocks, table[::-1])
            for b in table:
                held[b] -= 1
        self.running = still

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
            hits: list[int] = []
            if self.caching:
                # At most (prompt_len - 1) // bs blocks: the last prompt token is recomputed.
                hits = self._call(self.longest_hit, request.block_hashes, (prompt_len - 1) // bs)
            evictable = sum(1 for b in hits if self.held[b] == 0)
            prompt_blocks = _cdiv(prompt_len, bs)
            future = _cdiv(prompt_len + spec.output_len, bs) - prompt_blocks
            new_blocks = prompt_blocks - len(hits)
            free = self._call(self.pool.get_num_free_blocks)
            if new_blocks + evictable + future + self.reserved > free:
                if not self.running:
                    # replay() checked every request fits an empty pool; an empty pool that
                    # does not admit the head would loop for ever.
                    raise AssertionError(f"request {spec.id!r} does not fit an idle pool")
                break
            waiting.popleft()
            if hits:
                # Hits are protected before anything is allocated, or the allocation could
                # evict them (BEHAVIOUR.md invariant 25).
                self._call(self.pool.touch, hits)
                for b in hits:
                    self.held[b] += 1
            if self.caching:
                new = self._call(
                    self.allocate_and_cache,
                    request, hits, new_blocks, len(hits), prompt_len // bs, bs, GROUP_IDS[0],
                )
                self._allocated(new)
                entry = _Running(request, hits + new, len(hits), spec.output_len)
                self._cached(entry, prompt_len // bs)
            else:
                new = self._allocate(new_blocks) if new_blocks else []
                entry = _Running(request, hits + new, 0, spec.output_len)
            self.reserved += future
            self.running.append(entry)
            self.requests += 1
            self.prompt_tokens += prompt_len
            self.hit_tokens += len(hits) * bs
            admitted = True
        return admitted


__all__ = ["HASH_SEED", "SimulationReport", "replay"]
