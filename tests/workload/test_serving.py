"""The serving driver: a scheduler over the KV cache manager, for every model shape.

Every backend must make the same decisions (blocks, hits, evictions, preemptions, steps and
every step's usage), the calls the driver skips must be no-ops, hybrid models must preempt
when their non-full groups run short, and the pool must be empty at the end.
"""

from __future__ import annotations

import importlib.util

import pytest

from kvpool.errors import InvalidConfig
from kvpool.events import BlockRemoved
from kvpool.workload.models import MODELS, build_manager
from kvpool.workload.serving import serve
from kvpool.workload.synthetic import ChatWorkload
from kvpool.workload.trace import TraceRequest
from kvpool.workload.workloads import WORKLOADS, generate_workload

BACKENDS = ["spec", "reference"] + (["fast"] if importlib.util.find_spec("numba") else [])
COUNT_KEYS = ("pool_calls", "verb_calls")  # how many calls, not what they decided


def _serve(trace, model, backend, num_blocks, *, max_running=8, **kwargs):
    longest = max(len(r.prompt) + r.output_len for r in trace) + 16
    manager = build_manager(model, num_blocks, 16, longest, backend=backend)
    report = serve(manager, trace, block_size=16, max_running=max_running, backend=backend,
                   model=model, **kwargs)
    return manager, report


def _small_chat(num_requests, seed):
    """Chat with short prompts, so a small pool is under pressure but fits every request."""
    return ChatWorkload(num_requests=num_requests, seed=seed, system_prompt_tokens=(200, 600),
                        max_prompt_tokens=1200).generate()


def _decided(report):
    return {k: v for k, v in report.decisions().items() if k not in COUNT_KEYS}


@pytest.mark.parametrize("model", list(MODELS))
def test_every_backend_makes_the_same_decisions_step_by_step(model):
    trace = _small_chat(40, 5)
    results = {}
    for backend in BACKENDS:
        manager, report = _serve(trace, model, backend, 200)
        assert manager.usage == 0.0
        assert manager.block_pool.get_num_free_blocks() == 199
        results[backend] = (_decided(report), report.series)
    first = results[BACKENDS[0]]
    assert first[0]["evictions"] > 0, "the pool should be under pressure"
    for backend, got in results.items():
        assert got == first, backend


@pytest.mark.parametrize("model", list(MODELS))
def test_skipped_decode_calls_change_nothing(model):
    trace = generate_workload("agentic", num_requests=30, seed=2)
    _, skipping = _serve(trace, model, "reference", 700)
    _, calling = _serve(trace, model, "reference", 700, skip_idle_decode=False)
    assert _decided(skipping) == _decided(calling)
    assert skipping.series == calling.series
    if model == "full":
        assert skipping.pool_calls < calling.pool_calls


def test_a_hybrid_model_preempts_when_its_window_group_runs_short():
    trace = generate_workload("multi-turn", num_requests=40, seed=1)
    manager, report = _serve(trace, "full+swa", "reference", 420, max_running=16)
    assert report.preemptions > 0
    assert report.requests == 40
    assert manager.usage == 0.0


def test_evictions_are_the_removed_keys_of_the_events():
    trace = _small_chat(30, 3)
    removed = []

    def sink(events):
        removed.extend(len(e.block_hashes) for e in events if isinstance(e, BlockRemoved))

    _, report = _serve(trace, "full", "reference", 200, on_events=sink)
    assert report.evictions == sum(removed) == sum(report.series.evictions) > 0


def test_the_series_have_one_value_per_step():
    trace = generate_workload("doc-qa", num_requests=20, seed=0)
    _, report = _serve(trace, "full", "reference", 1200)
    series = report.series
    assert len(series.usage) == len(series.hit_rate) == len(series.evictions) == report.steps
    assert series.hit_rate[-1] == pytest.approx(report.hit_rate)
    assert report.peak_usage == max(series.usage)
    assert report.mean_usage == pytest.approx(sum(series.usage) / report.steps)


def test_a_request_larger_than_the_pool_is_named():
    trace = [TraceRequest("big", 0, tuple(range(400)), 10)]
    with pytest.raises(InvalidConfig, match="'big' needs 26 blocks"):
        _serve(trace, "full", "spec", 20)


def test_a_hybrid_request_that_never_fits_an_idle_pool_is_named():
    # 30 full-attention blocks fit; the window group's prefill blocks on top do not.
    trace = [TraceRequest("wide", 0, tuple(range(470)), 4)]
    with pytest.raises(InvalidConfig, match="'wide'.*does not fit an idle pool"):
        _serve(trace, "full+swa", "spec", 40)


def test_the_built_in_workloads_are_deterministic_and_shaped_as_described():
    for name in WORKLOADS:
        assert generate_workload(name, num_requests=30, seed=4) == \
            generate_workload(name, num_requests=30, seed=4)
    qa = generate_workload("doc-qa", num_requests=60, seed=0)
    documents = {r.id.split("-")[0] for r in qa}
    assert len(documents) <= 6 and min(len(r.prompt) for r in qa) >= 3000
    turns = generate_workload("multi-turn", num_requests=60, seed=0)
    by_id = {r.id: r for r in turns}
    followups = [r for r in turns if not r.id.endswith("-t0")]
    assert followups
    for r in followups:
        conversation, turn = r.id.rsplit("-t", 1)
        previous = by_id.get(f"{conversation}-t{int(turn) - 1}")
        if previous is not None:
            assert r.prompt[: len(previous.prompt)] == previous.prompt
    agentic = generate_workload("agentic", num_requests=60, seed=0)
    assert min(len(r.prompt) for r in agentic) >= 2500  # every turn carries the tool schema
    with pytest.raises(InvalidConfig, match="unknown workload"):
        generate_workload("nope")
