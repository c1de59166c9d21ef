"""``simulate``: replay a trace (the built-in chat trace by default) through a fresh pool.

This is the library function behind ``kvpool simulate``. It builds the pool with
:func:`kvpool.make_pool`, warms the backend up first (Numba compiles its kernels on first
use; that time is reported as ``warmup_s``, never as pool time) and hands the work to
:func:`kvpool.workload.driver.replay`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvpool.backends import make_pool
from kvpool.hashing import BlockHasher
from kvpool.workload.driver import HASH_SEED, SimulationReport, replay
from kvpool.workload.synthetic import ChatWorkload
from kvpool.workload.trace import TraceRequest, load_trace

DEFAULT_NUM_BLOCKS = 4096
"""Default pool size: 64k tokens at block size 16, small enough that the default chat trace
keeps the pool under pressure (cached blocks do get evicted)."""

DEFAULT_MAX_RUNNING = 64
"""Default bound on concurrently running requests (vLLM's ``max_num_seqs`` plays this role)."""

_WARMUP_WORKLOAD = ChatWorkload(
    num_requests=12,
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


def warm_up(backend: str, *, block_size: int = 16, hash_algorithm: str = "sha256") -> float:
    """Replay a tiny trace on a small pool of ``backend`` once; the seconds it took.

    Exercises every verb the replay uses (hits and evictions included), so a JIT backend
    has compiled them all before anything is timed.
    """
    began = time.perf_counter()
    pool = make_pool(64, backend=backend, hash_block_size=block_size)
    trace = _WARMUP_WORKLOAD.generate()
    replay(pool, trace, block_size=block_size, max_running=4,
           hasher=BlockHasher(hash_algorithm, seed=HASH_SEED))
    return time.perf_counter() - began


def resolve_trace(
    trace: Sequence[TraceRequest] | str | os.PathLike[str] | None,
    *,
    num_requests: int = 2000,
    seed: int = 0,
) -> list[TraceRequest]:
    """A path is loaded (and validated), ``None`` gives the built-in chat trace."""
    if trace is None:
        return ChatWorkload(num_requests=num_requests, seed=seed).generate()
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
    num_requests: int = 2000,
    hash_algorithm: str = "sha256",
    warmup: bool = True,
    pool_options: Mapping[str, Any] | None = None,
    event_sink: Callable[[list[Any]], None] | None = None,
) -> SimulationReport:
    """Replay ``trace`` through a fresh ``backend`` pool of ``num_blocks`` blocks.

    ``trace`` is a list of requests, a JSONL path, or ``None`` for the built-in chat trace
    of ``num_requests`` requests drawn with ``seed``. Raises
    :class:`~kvpool.errors.BackendUnavailable` when the backend cannot be loaded,
    :class:`~kvpool.workload.trace.TraceError` for a malformed trace file and
    :class:`~kvpool.errors.InvalidConfig` for sizes that cannot work.

    ``pool_options`` go to :func:`kvpool.make_pool` (e.g. ``use_int_block_hashes=False``).
    ``event_sink``, if given, turns KV events on and receives each step's events (after the
    step, outside pool time; steps without events are skipped), as a publisher wants them.

    >>> report = simulate(backend="spec", num_requests=5, num_blocks=512)
    >>> report.requests, report.blocks_allocated > 0
    (5, True)
    """
    requests = resolve_trace(trace, num_requests=num_requests, seed=seed)
    warmup_s = 0.0
    if warmup:
        warmup_s = warm_up(backend, block_size=block_size, hash_algorithm=hash_algorithm)
    options = dict(pool_options or {})
    if event_sink is not None:
        options["enable_kv_cache_events"] = True
    pool = make_pool(num_blocks, backend=backend, hash_block_size=block_size, **options)
    on_step = None
    if event_sink is not None:
        def on_step() -> None:
            events = pool.take_events()
            if events:
                event_sink(events)
    report = replay(
        pool,
        requests,
        block_size=block_size,
        max_running=max_running,
        hasher=BlockHasher(hash_algorithm, seed=HASH_SEED),
        backend=backend,
        on_step=on_step,
    )
    return replace(report, warmup_s=warmup_s)


__all__ = ["DEFAULT_MAX_RUNNING", "DEFAULT_NUM_BLOCKS", "resolve_trace", "simulate", "warm_up"]
