"""``simulate``: replay a trace (the built-in chat trace by default) through a fresh KV cache
manager.

This is the library function behind ``kvpool simulate``. It builds a
:class:`~kvpool.policy.KVCacheManager` for the model shape over a :func:`kvpool.make_pool`
pool, warms the backend up first (Numba compiles its kernels on first use; that time is
reported as ``warmup_s``, never as pool time) and hands the work to
:func:`kvpool.workload.serving.serve`. :func:`warm_up` is the bare-pool warm-up the trace
benchmarks (:mod:`kvpool.workload.driver`) use.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from kvpool.backends import PoolRecipe, make_pool
from kvpool.hashing import BlockHasher
from kvpool.policy import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec, make_kv_cache_manager
from kvpool.workload.driver import HASH_SEED, replay
from kvpool.workload.models import MODELS, build_manager
from kvpool.workload.serving import ServingReport, serve
from kvpool.workload.synthetic import ChatWorkload
from kvpool.workload.trace import TraceRequest, load_trace
from kvpool.workload.workloads import DEFAULT_WORKLOAD, generate_workload

DEFAULT_NUM_BLOCKS = 4096
"""Default pool size: 64k tokens at block size 16, small enough that the default chat trace
keeps the pool under pressure (cached blocks do get evicted)."""

DEFAULT_MAX_RUNNING = 64
"""Default bound on concurrently running requests (vLLM's ``max_num_seqs`` plays this role)."""

_WARMUP_WORKLOAD = ChatWorkload(
    num_requests=40,
    seed=0,
    num_system_prompts=1,
    system_prompt_share=1.0,
    system_prompt_tokens=(40, 60),
    user_message_tokens=12,
    output_tokens=20,
    max_prompt_tokens=400,
    conversation_rate=1.0,
    think_steps=1.0,
)
_WARMUP_BLOCKS = 72
"""The warm-up pool: more blocks than the fast pool's first 64 key rows, so its arrays grow
(the rehash kernel, the array handles' setters), and fewer than the warm-up trace's 151
allocations, so cached blocks are evicted (the allocation kernel that records evictions).
Anything the warm-up leaves out compiles inside the first timed calls of a replay."""


def warm_up(backend: str, *, block_size: int = 16, hash_algorithm: str = "sha256") -> float:
    """Replay a tiny trace on a small pool of ``backend`` once; the seconds it took.

    Exercises every verb the replay uses (hits and evictions included), so a JIT backend
    has compiled them all before anything is timed.
    """
    began = time.perf_counter()
    pool = make_pool(_WARMUP_BLOCKS, backend=backend, hash_block_size=block_size)
    trace = _WARMUP_WORKLOAD.generate()
    replay(pool, trace, block_size=block_size, max_running=4,
           hasher=BlockHasher(hash_algorithm, seed=HASH_SEED))
    return time.perf_counter() - began


def resolve_trace(
    trace: Sequence[TraceRequest] | str | os.PathLike[str] | None,
    *,
    num_requests: int | None = 2000,
    seed: int = 0,
    workload: str = DEFAULT_WORKLOAD,
) -> list[TraceRequest]:
    """A path is loaded (and validated), ``None`` gives the built-in ``workload``'s trace
    (its own default size when ``num_requests`` is ``None``)."""
    if trace is None:
        return generate_workload(workload, num_requests=num_requests, seed=seed)
    if isinstance(trace, (str, os.PathLike)):
        return load_trace(trace)
    return list(trace)


def simulate(
    trace: Sequence[TraceRequest] | str | os.PathLike[str] | None = None,
    *,
    backend: str = "fast",
    num_blocks: int = DEFAULT_NUM_BLOCKS,
    block_size: int = 16,
    max_running: int = DEFAULT_MAX_RUNNING,
    seed: int = 0,
    num_requests: int | None = None,
    workload: str = DEFAULT_WORKLOAD,
    model: str = "full",
    hash_algorithm: str = "sha256",
    warmup: bool = True,
    pool_options: Mapping[str, Any] | None = None,
    event_sink: Callable[[list[Any]], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> ServingReport:
    """Replay ``trace`` through a fresh KV cache manager over a ``backend`` pool.

    ``trace`` is a list of requests, a JSONL path, or ``None`` for the built-in ``workload``
    (:data:`kvpool.workload.workloads.WORKLOADS`) of ``num_requests`` requests drawn with
    ``seed``; ``model`` names the model shape (:data:`kvpool.workload.models.MODELS`). The
    manager is driven by :func:`kvpool.workload.serving.serve`. Raises
    :class:`~kvpool.errors.BackendUnavailable` when the backend cannot be loaded,
    :class:`~kvpool.workload.trace.TraceError` for a malformed trace file and
    :class:`~kvpool.errors.InvalidConfig` for sizes that cannot work.

    ``pool_options`` go to :func:`kvpool.make_pool` (e.g. ``use_int_block_hashes=False``),
    through a :class:`~kvpool.PoolRecipe`: the policy is chosen as without them.
    ``event_sink``, if given, receives each step's KV events (after the step, outside pool
    time; steps without events are skipped), as a publisher wants them. ``on_step(done,
    total)`` is called after every step with the requests finished so far.

    >>> report = simulate(backend="spec", num_requests=5, num_blocks=512)
    >>> report.requests, report.blocks_allocated > 0
    (5, True)
    """
    requests = resolve_trace(trace, num_requests=num_requests, seed=seed, workload=workload)
    warmup_s = 0.0
    if warmup:
        # Kernels do not depend on the block size: warm up at 16, where the tiny warm-up
        # trace fits the small pool whatever the replay's block size.
        warmup_s = warm_up_manager(backend, model=model, hash_algorithm=hash_algorithm)
    max_model_len = max((len(r.prompt) + r.output_len for r in requests), default=1) + block_size
    # A recipe, not a bare factory: it keeps the backend's name, by which the policy is
    # chosen (the fast policy drives the fast pool; kvpool.policy.factory).
    pools = PoolRecipe(backend, dict(pool_options)) if pool_options else backend
    manager = build_manager(model, num_blocks, block_size, max_model_len, backend=pools)
    manager.record_no_blocks_to_zero()  # no KV tensors to zero: nothing may pile up
    progress = None
    if on_step is not None:
        total = len(requests)
        progress = lambda done: on_step(done, total)  # noqa: E731
    with frozen_heap():
        report = serve(
            manager, requests, block_size=block_size, max_running=max_running,
            hasher=BlockHasher(hash_algorithm, seed=HASH_SEED), backend=backend, model=model,
            workload=workload if trace is None else "trace", on_events=event_sink,
            on_step=progress,
        )
    return replace(report, warmup_s=warmup_s)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Inside the block, the garbage collector skips the objects that exist when it starts,
    as a serving engine has it after its warm-up (vLLM's engine core freezes its heap then:
    ``vllm.utils.gc_utils.freeze_gc_heap``); the heap is unfrozen again on exit. Without
    it, the collections a replay triggers walk every module and object of the process, and
    that time lands inside whatever pool call triggered them. Nothing is done when the
    collector is off or the caller has frozen objects already (theirs stay as they are)."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def warm_up_manager(backend: str, *, model: str = "full", block_size: int = 16,
                    hash_algorithm: str = "sha256") -> float:
    """Replay a tiny trace through a small manager of ``backend``, with KV cache events on
    and off (evictions take a different kernel each way); the seconds it took (a JIT backend
    compiles every kernel the replays use, hits and evictions included)."""
    began = time.perf_counter()
    trace = _WARMUP_WORKLOAD.generate()
    longest = max(len(r.prompt) + r.output_len for r in trace) + block_size
    for events in (True, False):
        manager = build_manager(model, _WARMUP_BLOCKS, block_size, longest, backend=backend,
                                enable_kv_cache_events=events)
        managers = [manager, *_with_narrow_windows(manager, longest, block_size, backend,
                                                   events)]
        for manager in managers:
            manager.record_no_blocks_to_zero()
            hasher = BlockHasher(hash_algorithm, seed=HASH_SEED)
            serve(manager, trace, block_size=block_size, max_running=4, hasher=hasher)
            _cross_a_boundary_as_async_scheduling_does(manager, block_size, hasher)
        # What an engine also reads: the longest key among a table's blocks (vLLM 0.33
        # estimates each request's cached tokens so).
        manager.block_pool.observe().max_key_tokens([1])
    return time.perf_counter() - began


def _with_narrow_windows(manager: Any, max_model_len: int, block_size: int, backend: str,
                         events: bool) -> list[Any]:
    """For a model with sliding windows, the same model with each window two blocks wide
    (else nothing): the warm-up trace's requests are shorter than a real window, so only a
    narrow one frees blocks as it slides (one-block frees, the kernels they call)."""
    groups = manager.kv_cache_config.kv_cache_groups
    if not any(type(g.kv_cache_spec) is SlidingWindowSpec for g in groups):
        return []
    narrow = tuple(
        KVCacheGroupSpec(replace(g.kv_cache_spec, sliding_window=2 * block_size))
        if type(g.kv_cache_spec) is SlidingWindowSpec else g for g in groups)
    return [make_kv_cache_manager(KVCacheConfig(_WARMUP_BLOCKS, narrow), max_model_len,
                                  block_size, block_size, max_num_batched_tokens=max_model_len,
                                  enable_kv_cache_events=events, backend=backend)]


def warm_up_engine(backend: str = "fast", *, block_size: int = 16,
                   hash_algorithm: str = "sha256") -> float:
    """:func:`warm_up_manager` for every model shape (:data:`~kvpool.workload.models.MODELS`),
    as an engine warms up before it knows its model: a hybrid's lookups and Mamba's state
    moves use kernels a full-attention replay never calls (the sliding window's run
    lookup; one-block touches and frees, key releases), which would otherwise load, or
    compile, inside its first scheduler steps. The seconds it took (after the first shape,
    ~0.1 s each on a warm disk cache)."""
    return sum(warm_up_manager(backend, model=model, block_size=block_size,
                               hash_algorithm=hash_algorithm) for model in MODELS)


def _cross_a_boundary_as_async_scheduling_does(manager: Any, block_size: int,
                                               hasher: BlockHasher) -> None:
    """One request decoded across a block boundary as vLLM's async scheduler steps it: a
    step is allocated before the previous step's token is appended, so the token that fills
    a block is keyed by the step that takes the next one (one pool call on the fast policy,
    which ``serve``'s synchronous steps never make)."""
    from kvpool.hashing import get_request_block_hasher
    from kvpool.policy import SchedulerRequest

    prompt = list(range(2 * block_size - 1))
    request = SchedulerRequest("kvpool-warm-up-async", prompt,
                               block_hasher=get_request_block_hasher(block_size, hasher))
    hits, num_hits = manager.get_computed_blocks(request)
    manager.allocate_slots(request, len(prompt) - num_hits, num_hits, hits)
    request.num_computed_tokens = len(prompt)
    for token in range(2):  # the second step takes block 3 and keys block 2
        manager.allocate_slots(request, 1)
        request.num_computed_tokens += 1
        request.append_output_token_ids(token)
    manager.free(request)


__all__ = ["DEFAULT_MAX_RUNNING", "DEFAULT_NUM_BLOCKS", "DEFAULT_WORKLOAD", "frozen_heap",
           "resolve_trace", "simulate", "warm_up", "warm_up_engine", "warm_up_manager"]
