"""The trace suite: the ``kvpool simulate`` replay, timed per backend.

Every backend replays the same trace (loaded or generated once) on a fresh pool per run,
after one warm-up replay of a tiny trace (:func:`kvpool.workload.simulate.warm_up`, reported
as ``warmup_s``). Figures: ``pool_s`` and ``wall_s`` (medians), and the replay's decisions
``blocks_allocated``, ``hit_rate``, ``evictions``, ``requests``, ``pool_calls``, which must
be identical across runs and backends: a difference raises :class:`ReplayDivergence`.
Per pool verb of the replay (``admit``, ``step``, ``get_usage``): ``<verb>_calls`` and
``<verb>_us_per_call``, where the pool time goes (no ratio: ``pool_s`` is the figure).
"""

from __future__ import annotations

from typing import Any

from kvpool.backends import make_pool
from kvpool.bench.config import BenchConfig
from kvpool.errors import KvPoolError
from kvpool.hashing import BlockHasher
from kvpool.workload.driver import HASH_SEED, SimulationReport, replay
from kvpool.workload.simulate import DEFAULT_MAX_RUNNING, resolve_trace, warm_up

BLOCK_SIZE = 16
DECISION_FIGURES = ("blocks_allocated", "hit_rate", "evictions", "requests", "pool_calls")


class ReplayDivergence(KvPoolError, AssertionError):
    """Two replays of one trace made different decisions (a backend disagrees)."""


def run_trace(config: BenchConfig) -> dict[str, dict[str, list[float]]]:
    """Samples per backend and figure; timed figures have ``repeat`` samples."""
    trace = resolve_trace(config.trace, num_requests=config.num_trace_requests, seed=config.seed)
    samples: dict[str, dict[str, list[float]]] = {
        backend: {"warmup_s": [warm_up(backend, block_size=BLOCK_SIZE)]}
        for backend in config.backends
    }
    baseline: tuple[str, dict[str, Any]] | None = None
    for _ in range(config.repeat):
        for backend in config.backends:
            pool = make_pool(config.trace_num_blocks, backend=backend, hash_block_size=BLOCK_SIZE)
            report = replay(
                pool,
                trace,
                block_size=BLOCK_SIZE,
                max_running=DEFAULT_MAX_RUNNING,
                hasher=BlockHasher("sha256", seed=HASH_SEED),
                backend=backend,
            )
            baseline = _check_same_decisions(baseline, backend, report)
            figures = samples[backend]
            for name in ("pool_s", "wall_s", *DECISION_FIGURES):
                figures.setdefault(name, []).append(getattr(report, name))
            for verb, calls in report.verb_calls.items():
                figures.setdefault(f"{verb}_calls", []).append(calls)
                figures.setdefault(f"{verb}_us_per_call", []).append(
                    report.verb_s[verb] / calls * 1e6)
    return samples


def _check_same_decisions(
    baseline: tuple[str, dict[str, Any]] | None, backend: str, report: SimulationReport
) -> tuple[str, dict[str, Any]]:
    decisions = report.decisions()
    if baseline is None:
        return backend, decisions
    first_backend, expected = baseline
    if decisions != expected:
        differing = {k: (v, decisions[k]) for k, v in expected.items() if v != decisions[k]}
        raise ReplayDivergence(
            f"replay on {backend} differs from {first_backend}: {differing}"
        )
    return baseline


__all__ = ["DECISION_FIGURES", "ReplayDivergence", "run_trace"]
