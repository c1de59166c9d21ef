"""``benchmarks/bench_kernels.py``: recording a replay's batch-kernel calls and replaying them
on a fresh pool reproduces every result (timings themselves are never asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from kvpool.workload.trace import TraceRequest  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernels.py"


def _script():
    spec = importlib.util.spec_from_file_location("bench_kernels", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recorded_kernel_calls_replay_to_the_same_results():
    bench = _script()
    shared = list(range(5000, 5000 + 64))
    requests = [TraceRequest(f"r{i}", i // 4, (*shared[: 16 * (i % 4 + 1)], *range(i, i + 40)), 20)
                for i in range(24)]
    with bench._Recorder() as recorder:
        report = bench._replay_trace(requests)
    calls = recorder.calls
    assert {verb for verb, *_ in calls} == {"admit", "step"}
    assert report.hit_tokens > 0
    ops = bench._operations(calls, report.evictions)
    assert ops["pops"] == report.blocks_allocated and ops["lookups"] > 0
    durations = np.zeros(len(calls), np.int64)
    bench._kernel_round(calls, durations)  # raises if a call returns something else
    assert (durations != 0).all()
