"""``simulate``: the library function behind ``kvpool simulate``."""

from __future__ import annotations

import pytest

from kvpool.errors import BackendUnavailable
from kvpool.workload import SimulationReport, simulate, synthetic_trace, write_trace
from kvpool.workload.serving import ServingReport


def test_simulate_replays_the_built_in_trace_by_default():
    report = simulate(backend="spec", num_requests=12, num_blocks=512, seed=4)
    assert isinstance(report, SimulationReport)
    assert report.requests == 12
    assert report.prompt_tokens > 0
    assert 0 <= report.hit_rate <= 1
    assert 0 < report.peak_usage <= 1
    assert report.pool_s > 0 and report.wall_s >= report.pool_s
    assert report.backend == "spec"


def test_a_trace_file_and_the_same_requests_in_memory_replay_alike(tmp_path):
    trace = synthetic_trace(num_requests=10, seed=2)
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    from_file = simulate(path, backend="reference", num_blocks=512, warmup=False)
    in_memory = simulate(trace, backend="reference", num_blocks=512, warmup=False)
    assert from_file.decisions() == in_memory.decisions()


def test_the_json_keys_come_first_in_to_dict():
    report = simulate(backend="spec", num_requests=3, num_blocks=256, warmup=False)
    assert list(report.to_dict())[:10] == list(ServingReport.JSON_FIELDS)
    assert list(report.summary()) == list(ServingReport.JSON_FIELDS)


def test_an_unknown_backend_is_backend_unavailable():
    with pytest.raises(BackendUnavailable):
        simulate(backend="gpu-magic", num_requests=2)
