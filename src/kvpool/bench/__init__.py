"""Benchmarks as a library: each backend against the reference, in one run, same workload.

Suites (``kvpool bench --suite ...``):

* :mod:`~kvpool.bench.construct` – seconds and bytes per block to build 100k / 1M blocks;
* :mod:`~kvpool.bench.micro` – one verb at a time (alloc+free batches, touch, lookups, ...);
* :mod:`~kvpool.bench.trace_suite` – the ``kvpool simulate`` replay (pool and wall time);
* ``hashing`` – blocks hashed per second per algorithm (:mod:`kvpool.hashing.bench`).

Every figure is the median of ``repeat`` runs after a separately reported warm-up, and comes
with its ratio to the reference measured in the same run (:mod:`~kvpool.bench.report`).
Absolute numbers belong to one machine; the ratios and targets are what to compare.
"""

from kvpool.bench.config import SUITES, BenchConfig
from kvpool.bench.report import TARGETS, format_results
from kvpool.bench.runner import run_bench
from kvpool.bench.trace_suite import ReplayDivergence

__all__ = ["SUITES", "TARGETS", "BenchConfig", "ReplayDivergence", "format_results", "run_bench"]
