"""``kvpool bench``: tiny (``--quick``) runs emit the documented JSON; exit codes. No timings."""

from __future__ import annotations

import importlib.util
import json

import pytest

import kvpool.cli.bench as bench_cli
from kvpool.bench import ReplayDivergence
from kvpool.cli import main

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
PAIR = "fast,reference" if HAVE_NUMBA else "spec,reference"
OTHER = PAIR.split(",")[0]

MICRO_FIGURES = {
    "warmup_s",
    "alloc_free_1_blocks_per_s",
    "alloc_free_1_pair_us",
    "alloc_free_16_blocks_per_s",
    "alloc_free_64_blocks_per_s",
    "alloc_free_256_blocks_per_s",
    "touch_64_blocks_per_s",
    "get_cached_block_hit_per_s",
    "get_cached_block_miss_per_s",
    "cache_full_blocks_64_blocks_per_s",
    "find_longest_cache_hit_64_blocks_per_s",
}
TRACE_FIGURES = {"pool_s", "wall_s", "blocks_allocated", "hit_rate", "evictions"}


def _bench_json(capsys, *args: str) -> dict:
    assert main(["bench", "--repeat", "1", "--quick", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_micro_emits_every_figure_per_backend_and_ratios_to_the_reference(capsys):
    result = _bench_json(capsys, "--suite", "micro", "--backends", PAIR)
    assert set(result["micro"]) == set(PAIR.split(","))
    for backend in PAIR.split(","):
        assert set(result["micro"][backend]) == MICRO_FIGURES
        assert all(value > 0 for value in result["micro"][backend].values())
    ratios = result["ratios"]["micro"]
    assert set(ratios) == {OTHER}  # the reference has no ratio to itself
    assert set(ratios[OTHER]) == MICRO_FIGURES - {"warmup_s"}
    assert result["meta"]["quick"] is True and result["meta"]["repeat"] == 1
    assert {t["figure"] for t in result["targets"]} == {
        "alloc_free_64_blocks_per_s", "alloc_free_1_pair_us"}
    assert all(t["met"] is None for t in result["targets"])  # quick sizes: not evaluated


def test_trace_emits_the_replay_figures_which_agree_across_backends(capsys):
    result = _bench_json(capsys, "--suite", "trace", "--backends", PAIR)
    figures = result["trace"]
    for backend in PAIR.split(","):
        assert TRACE_FIGURES <= set(figures[backend])
    for name in ("blocks_allocated", "hit_rate", "evictions"):
        assert figures[OTHER][name] == figures["reference"][name]
    assert set(result["ratios"]["trace"][OTHER]) == {"pool_s", "wall_s"}


def test_construct_measures_seconds_and_bytes_per_block(capsys):
    result = _bench_json(capsys, "--suite", "construct", "--backends", "reference")
    figures = result["construct"]["reference"]
    for label in ("1k", "10k"):
        assert figures[f"construct_{label}_s"] > 0
        assert figures[f"construct_{label}_bytes_per_block"] > 0
    assert result["ratios"]["construct"] == {}


def test_hashing_reports_blocks_per_second_per_algorithm(capsys):
    result = _bench_json(capsys, "--suite", "hashing", "--backends", "reference")
    assert result["hashing"]["shared"]["sha256_blocks_per_s"] > 0


def test_the_text_report_has_a_table_and_the_targets(capsys):
    assert main(["bench", "--repeat", "1", "--quick", "--suite", "micro",
                 "--backends", PAIR]) == 0
    out = capsys.readouterr().out
    assert "suite: micro" in out and f"{OTHER}/ref" in out and "targets" in out
    assert "┃ figure" in out  # a rich table, not a hand-aligned one


def test_an_unknown_backend_exits_2(capsys):
    assert main(["bench", "--quick", "--suite", "micro", "--backends", "nope"]) == 2
    assert "unknown backend" in capsys.readouterr().err


def test_a_malformed_trace_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text("[]\n")
    assert main(["bench", "--quick", "--suite", "trace", "--backends", "reference",
                 "--trace", str(path)]) == 2
    assert f"{path}:1:" in capsys.readouterr().err


def _fake_results(met: bool | None) -> dict:
    return {"meta": {"suites": [], "repeat": 1, "quick": False},
            "ratios": {}, "targets": [{"name": "t", "suite": "micro", "figure": "x_us",
                                       "goal": 1.0, "value": 2.0, "met": met}]}


@pytest.mark.parametrize(("met", "check", "code"),
                         [(False, True, 1), (False, False, 0), (True, True, 0), (None, True, 0)])
def test_check_exits_1_only_when_a_measured_target_is_missed(monkeypatch, capsys, met, check,
                                                            code):
    monkeypatch.setattr(bench_cli, "run_bench", lambda config, suites, **_: _fake_results(met))
    args = ["bench", "--suite", "micro"] + (["--check"] if check else [])
    assert main(args) == code


def test_diverging_replays_exit_1(monkeypatch, capsys):
    def diverge(config, suites, **_):
        raise ReplayDivergence("replay on fast differs from reference: {}")

    monkeypatch.setattr(bench_cli, "run_bench", diverge)
    assert main(["bench", "--suite", "trace"]) == 1
    assert "differs" in capsys.readouterr().err
