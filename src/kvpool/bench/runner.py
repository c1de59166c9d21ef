"""``run_bench``: run the chosen suites and assemble one JSON-ready result.

The result is ``{"<suite>": {"<backend>": {"<figure>": median}}, "ratios": {"<suite>":
{"<backend>": {"<figure>": ratio}}}, "targets": [...], "meta": {...}}``. Every backend runs
in this process on the same seeded workload (construction alone runs in subprocesses, see
:mod:`kvpool.bench.construct`), after a warm-up reported as the ``warmup_s`` figure.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any

from kvpool.backends import backend_class
from kvpool.bench.config import SUITES, BenchConfig
from kvpool.bench.construct import run_construct
from kvpool.bench.micro import run_micro
from kvpool.bench.report import TARGETS, medians, ratios
from kvpool.bench.trace_suite import run_trace
from kvpool.errors import InvalidConfig

HASHING_BACKEND_KEY = "shared"
"""Hashing does not depend on the pool backend: its figures sit under this one key."""


def hashing_available() -> bool:
    """Whether the hashing benchmark (:mod:`kvpool.hashing.bench`) is installed."""
    try:
        from kvpool.hashing.bench import run_hashing_bench  # noqa: F401
    except ImportError:
        return False
    return True


def _run_hashing(config: BenchConfig) -> dict[str, dict[str, float]]:
    from kvpool.hashing.bench import run_hashing_bench

    rates = run_hashing_bench(config.hashing_blocks, config.repeat, seed=config.seed)
    return {HASHING_BACKEND_KEY: {f"{name}_blocks_per_s": rate for name, rate in rates.items()}}


def run_bench(config: BenchConfig, suites: Sequence[str] = SUITES,
              on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run ``suites`` (in :data:`SUITES` order) and return the assembled result;
    ``on_progress(done, total)`` after each suite.

    Raises :class:`~kvpool.errors.BackendUnavailable` before measuring anything if a backend
    cannot be loaded, and :class:`~kvpool.errors.InvalidConfig` for unknown suites.
    """
    config.validate()
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise InvalidConfig(f"unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
    if "hashing" in suites and not hashing_available():
        raise InvalidConfig("the hashing suite needs kvpool.hashing.bench, which is missing")
    for backend in config.backends:
        backend_class(backend)
    ordered = [s for s in SUITES if s in suites]
    results: dict[str, Any] = {}
    all_ratios: dict[str, Any] = {}
    for suite in ordered:
        if suite == "construct":
            figures = run_construct(config)
        elif suite == "micro":
            figures = medians(run_micro(config))
        elif suite == "trace":
            figures = medians(run_trace(config))
        else:
            figures = _run_hashing(config)
        results[suite] = figures
        all_ratios[suite] = ratios(figures)
        if on_progress is not None:
            on_progress(len(results), len(ordered))
    results["ratios"] = all_ratios
    results["targets"] = [t.evaluate(results, config.quick) for t in TARGETS if t.suite in ordered]
    results["meta"] = {
        "suites": ordered,
        "backends": list(config.backends),
        "repeat": config.repeat,
        "quick": config.quick,
        "seed": config.seed,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "numba": _version("numba"),
        "numpy": _version("numpy"),
    }
    return results


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


__all__ = ["HASHING_BACKEND_KEY", "hashing_available", "run_bench"]
