"""``kvpool bench --vs-vllm``: the kvpool side of the comparison, and the real run (optional).

The vLLM-pattern replay issues the kit's calls one by one; on every backend it must decide
exactly as the batch-verb driver (``kvpool simulate``) does, and as the spec does. The real
comparison needs a vLLM kit venv: set ``KVPOOL_VLLM_PYTHON`` (and ``KVPOOL_VLLM_KIT`` unless
the kit is at ``../shared/vllm-kit``) to run it; it skips otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys

import pytest

from kvpool import make_pool
from kvpool.bench import vllm_pattern
from kvpool.bench.vs_vllm import (
    CONSTRUCT_CLOCK,
    CONSTRUCT_FIGURES,
    DECISIONS,
    MICRO_RATES,
    VsVllmConfig,
    _micro_slices,
    _Samples,
    _vllm_construct,
    default_kit,
    format_table,
    table_rows,
)
from kvpool.hashing import BlockHasher
from kvpool.workload.driver import HASH_SEED, replay
from kvpool.workload.tokens import output_tokens
from kvpool.workload.trace import TraceRequest

BACKENDS = ["spec", "reference"] + (["fast"] if importlib.util.find_spec("numba") else [])


def small_kit_like_trace(n: int = 60, seed: int = 3) -> list[tuple[str, int, list, list]]:
    """The kit's workload shape, scaled down: shared system prompts, 20 output tokens."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(500) for _ in range(rng.randint(16, 80))] for _ in range(4)]
    trace = []
    for i in range(n):
        total = rng.randint(16, 160)
        tokens = (prefixes[rng.randrange(4)] if rng.random() < 0.5 else [])
        tokens = tokens + [rng.randrange(500) for _ in range(max(total - len(tokens), 1))]
        # The driver decodes output_tokens(id): the same values here, so decode blocks match.
        trace.append((str(i), rng.randrange(0, 30), tokens, output_tokens(str(i), 20)))
    return trace


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_vllm_call_pattern_decides_as_the_batch_verbs_driver(backend):
    trace = small_kit_like_trace()
    hasher = BlockHasher("sha256", seed=HASH_SEED)
    pattern_pool = make_pool(120, backend=backend, hash_block_size=16)
    got = vllm_pattern.replay_vllm_pattern(pattern_pool, trace, hasher, max_running=8)
    driver_pool = make_pool(120, backend=backend, hash_block_size=16)
    report = replay(driver_pool, [TraceRequest(r, a, tuple(p), len(o)) for r, a, p, o in trace],
                    block_size=16, max_running=8, hasher=hasher)
    decisions = report.decisions()
    assert {k: got[k] for k in DECISIONS} == {k: decisions[k] for k in DECISIONS}
    assert got["evictions"] > 0 and got["hit_tokens"] > 0  # the trace exercises both
    assert pattern_pool.abstract().state == driver_pool.abstract().state
    assert got["pool_s"] > 0 and got["wall_s"] >= got["pool_s"]


def test_the_micro_loops_run_on_every_backend_shape():
    hasher = BlockHasher("sha256", seed=HASH_SEED)
    figures = vllm_pattern.run_micro("reference", hasher, n_blocks=300, iters=600)
    assert set(figures) >= {"alloc1_free1_pairs_per_s", "get_cached_block_hit_per_s",
                            "alloc1_evicting_per_s", "hash_prompt_kvhash_raw_blocks_per_s"}
    assert all(v > 0 for v in figures.values())


def test_the_micro_loops_alternate_between_the_sides_in_short_runs(monkeypatch):
    runs = []

    class FakeVllm:
        def ask(self, command):
            runs.append(("vllm", command["iters"]))
            return dict.fromkeys(MICRO_RATES, 1.0)

    def fake_run_micro(backend, hasher, clock, iters):
        runs.append((backend, iters))
        return dict.fromkeys(MICRO_RATES, 2.0)

    monkeypatch.setattr(vllm_pattern, "run_micro", fake_run_micro)
    samples = _Samples()
    config = VsVllmConfig(python="-", kit="-", backends=("fast", "reference"), micro_slices=4)
    _micro_slices(config, FakeVllm(), samples, "cpu", lambda: 0.0)
    pair = [("vllm", 50_000), ("fast", 50_000), ("reference", 50_000)]
    flipped = [("fast", 50_000), ("reference", 50_000), ("vllm", 50_000)]
    assert runs == pair + flipped + pair + flipped  # the side that starts alternates
    for side in ("vllm", "fast/pattern", "reference/pattern"):
        assert len(samples.values[(side, "alloc1_free1_pairs_per_s", "cpu")]) == 4


@pytest.mark.parametrize("field", [{"rounds": 0}, {"micro_slices": 0}])
def test_a_comparison_without_rounds_or_micro_slices_is_refused_before_anything_runs(field):
    from kvpool.bench.vs_vllm import run_vs_vllm
    from kvpool.errors import InvalidConfig

    with pytest.raises(InvalidConfig):  # no kit and no vLLM python are touched first
        run_vs_vllm(VsVllmConfig(python="/nonexistent", kit="/nonexistent", **field))


def test_the_table_has_one_row_per_figure_and_clock_with_ratios_the_right_way_round():
    config = VsVllmConfig(python="-", kit="-", backends=("fast",), rounds=1)
    samples = _Samples()
    for clock in ("cpu", "wall"):
        samples.add("vllm", clock, {"pool_s": 2.0, "wall_s": 4.0, "hash_s": 1.0,
                                    "alloc1_free1_pairs_per_s": 100.0}, ("pool_s", "wall_s",
                                                                         "hash_s",
                                                                         "alloc1_free1_pairs_per_s"))
        samples.add("fast/batch", clock, {"pool_s": 0.5, "wall_s": 1.0, "hash_s": 0.5},
                    ("pool_s", "wall_s", "hash_s"))
        samples.add("fast/pattern", clock, {"alloc1_free1_pairs_per_s": 300.0},
                    ("alloc1_free1_pairs_per_s",))
    rows = table_rows(samples, config)
    by_name = {(r["figure"], r["clock"]): r for r in rows}
    batch = by_name[("trace pool s, batch verbs [fast]", "cpu")]
    assert batch["ratio"]["fast"] == pytest.approx(4.0)  # time: vLLM / kvpool
    micro = by_name[("micro alloc1_free1_pairs_per_s", "cpu")]
    assert micro["ratio"]["fast"] == pytest.approx(3.0)  # rate: kvpool / vLLM
    text = format_table({"rows": rows, "meta": {"backends": ["fast"], "rounds": 1,
                                                "python": "3", "vllm": {}}})
    assert "4.00x" in text and "3.00x" in text


def test_the_construct_rows_compare_fresh_process_figures_and_judge_the_byte_bound(capsys):
    config = VsVllmConfig(python="-", kit="-", backends=("fast",), rounds=1)
    samples = _Samples()
    vllm_row = {"1000000": {"n": 1_000_000, "seconds": 1.2, "rss_growth_mib": 100.0,
                            "tracemalloc_peak_mib": 130.0}}
    samples.add("vllm", CONSTRUCT_CLOCK, _vllm_construct(vllm_row), CONSTRUCT_FIGURES)
    samples.add("fast/pattern", CONSTRUCT_CLOCK,
                {"construct_1M_s": 0.003, "construct_1M_bytes_per_block": 50.0},
                CONSTRUCT_FIGURES)
    by_name = {r["figure"]: r for r in table_rows(samples, config)}
    seconds = by_name["construct 1M blocks s"]
    assert seconds["ratio"]["fast"] == pytest.approx(400.0) and seconds["met"]
    memory = by_name["construct 1M blocks, bytes per block"]
    assert memory["vllm"] == pytest.approx(130 * 2**20 / 1e6)  # the larger of the two
    assert memory["met"] is False  # 50 > 48 bytes per block
    text = format_table({"rows": list(by_name.values()),
                         "meta": {"backends": ["fast"], "rounds": 1, "python": "3", "vllm": {}}})
    assert "<= 48 MISSED" in text and ">= 200x met" in text
    from kvpool.cli.bench import print_vs_vllm  # the CLI's rich table: the same verdicts

    print_vs_vllm({"rows": list(by_name.values()),
                   "meta": {"backends": ["fast"], "rounds": 1, "python": "3", "vllm": {}}})
    shown = capsys.readouterr().out
    assert "<= 48 MISSED" in shown and ">= 200x met" in shown


VLLM_PYTHON = os.environ.get("KVPOOL_VLLM_PYTHON")


@pytest.mark.skipif(not VLLM_PYTHON or not default_kit(),
                    reason="no vLLM kit: set KVPOOL_VLLM_PYTHON (and KVPOOL_VLLM_KIT)")
def test_the_real_comparison_runs_and_vllm_decides_as_kvpool():
    result = subprocess.run(
        [sys.executable, "-m", "kvpool", "bench", "--vs-vllm", VLLM_PYTHON, "--rounds", "1",
         "--backends", "fast", "--no-micro", "--json"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"vllm": "0.' in result.stdout
