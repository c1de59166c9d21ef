"""``kvpool simulate``: summary, ``--json`` keys, and exit 2 without a traceback on bad input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from cli.terminal import run_kvpool
from kvpool.backends import BACKENDS
from kvpool.cli import main
from kvpool.workload import synthetic_trace, write_trace
from kvpool.workload.models import MODELS
from kvpool.workload.workloads import WORKLOADS

JSON_KEYS = ["requests", "prompt_tokens", "hit_tokens", "hit_rate", "evictions", "preemptions",
             "peak_usage", "mean_usage", "pool_s", "wall_s"]
SMALL = ["--backend", "spec", "--requests", "8", "--num-blocks", "512"]


def test_the_summary_names_every_figure(capsys):
    assert main(["simulate", *SMALL]) == 0
    out = capsys.readouterr().out
    for label in ("requests", "prompt tokens", "generated tokens", "prefix hits", "evictions",
                  "preemptions", "peak usage", "mean usage", "pool time", "wall time"):
        assert label in out


def test_json_prints_one_object_with_the_documented_keys(capsys):
    assert main(["simulate", *SMALL, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert list(record) == JSON_KEYS
    assert record["requests"] == 8


def test_a_trace_file_is_replayed(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_trace(synthetic_trace(num_requests=5, seed=1), path)
    assert main(["simulate", "--trace", str(path), "--backend", "reference", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 5


def test_a_malformed_line_exits_2_naming_the_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "arrival_step": 0, "prompt": [1], "output_len": 1}\n'
                    '{"id": "b", "arrival_step": "soon", "prompt": [1], "output_len": 1}\n')
    assert main(["simulate", "--trace", str(path), "--backend", "spec"]) == 2
    captured = capsys.readouterr()
    assert f"{path}:2:" in captured.err and "arrival_step" in captured.err
    assert captured.out == ""


def test_a_missing_trace_file_exits_2(tmp_path, capsys):
    assert main(["simulate", "--trace", str(tmp_path / "nope.jsonl"), "--backend", "spec"]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_a_pool_too_small_for_a_request_exits_2(capsys):
    assert main(["simulate", "--backend", "spec", "--requests", "4", "--num-blocks", "8"]) == 2
    assert "usable blocks" in capsys.readouterr().err


def test_a_missing_fast_backend_is_explained(monkeypatch, capsys):
    hint = BACKENDS["fast"][2]
    monkeypatch.setitem(BACKENDS, "fast", ("kvpool._not_installed", "FastBlockPool", hint))
    assert main(["simulate", "--requests", "2"]) == 2
    err = capsys.readouterr().err
    assert "'fast' is not available" in err and "numba" in err


def test_the_installed_command_prints_no_traceback(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("{oops\n")
    done = subprocess.run(
        [sys.executable, "-m", "kvpool", "simulate", "--trace", str(path), "--backend", "spec"],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"{path}:1:" in done.stderr


@pytest.mark.parametrize("args", [
    ["--backend", "nope"], ["--num-blocks", "0"], ["--block-size", "0"],
    ["--block-size", "99999999"], ["--workload", "nope"], ["--model", "nope"],
    ["--compare", "fast"], ["--compare", "fast,nope"], ["--requests", "-3"],
])
def test_bad_usage_exits_2_naming_the_argument(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(["simulate", *args])
    assert info.value.code == 2
    assert args[0] in capsys.readouterr().err


def test_requests_with_a_trace_file_is_refused(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_trace(synthetic_trace(num_requests=2, seed=1), path)
    assert main(["simulate", "--trace", str(path), "--requests", "5"]) == 2
    assert "--requests" in capsys.readouterr().err


def test_workload_with_a_trace_file_is_refused(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_trace(synthetic_trace(num_requests=2, seed=1), path)
    assert main(["simulate", "--trace", str(path), "--workload", "doc-qa"]) == 2
    assert "--workload" in capsys.readouterr().err


def test_a_trace_line_with_a_missing_field_is_named(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "arrival_step": 0, "prompt": [1, 2]}\n')
    assert main(["simulate", "--trace", str(path), "--backend", "spec"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:1:" in err and "output_len" in err and "Traceback" not in err


def test_help_describes_every_workload_and_model(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = capsys.readouterr().out
    for item in (*WORKLOADS.values(), *MODELS.values()):
        assert item.name in out and item.description in out


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("model", list(MODELS))
def test_every_workload_runs_on_every_model(workload, model, capsys):
    assert main(["simulate", "--backend", "reference", "--workload", workload, "--model",
                 model, "--requests", "6", "--num-blocks", "2500", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 6


def test_plot_writes_a_png(tmp_path, capsys):
    out = tmp_path / "run.png"
    assert main(["simulate", *SMALL, "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert str(out) in capsys.readouterr().out


def test_plot_into_a_missing_directory_exits_2(tmp_path, capsys):
    assert main(["simulate", *SMALL, "--plot", str(tmp_path / "no" / "run.png")]) == 2
    assert "run.png" in capsys.readouterr().err


def test_compare_prints_one_table_and_asserts_the_same_decisions(capsys):
    assert main(["simulate", "--compare", "spec,reference", "--requests", "8",
                 "--num-blocks", "512"]) == 0
    out = capsys.readouterr().out
    assert "same decisions" in out and "spec" in out and "reference" in out
    assert main(["simulate", "--compare", "spec,reference", "--requests", "4",
                 "--num-blocks", "512", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["same_decisions"] is True
    assert list(record["backends"]["spec"]) == JSON_KEYS


def test_compare_exits_1_when_backends_decide_differently(monkeypatch, capsys):
    import kvpool.cli.simulate as cli
    from kvpool.workload.simulate import simulate as real

    def skewed(*args, **kwargs):
        report = real(*args, **kwargs)
        if kwargs["backend"] == "reference":
            report = dataclasses.replace(report, evictions=report.evictions + 1)
        return report

    monkeypatch.setattr(cli, "simulate", skewed)
    assert main(["simulate", "--compare", "spec,reference", "--requests", "4",
                 "--num-blocks", "512"]) == 1
    captured = capsys.readouterr()
    assert "DIFFERENT decisions: evictions" in captured.out
    assert "evictions" in captured.err


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvpool", "simulate", *SMALL],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0 and done.stderr == ""
    assert "\x1b[" not in done.stdout  # no colour codes into a pipe


LONGER = ["--backend", "reference", "--requests", "150", "--num-blocks", "1024"]


def test_a_progress_bar_is_drawn_on_a_terminal():
    rc, _, drawn = run_kvpool(["simulate", *LONGER], terminal=True)
    assert rc == 0
    assert "simulate" in drawn and "requests" in drawn  # the bar's label and unit


def test_json_draws_no_progress_bar_even_on_a_terminal():
    rc, out, drawn = run_kvpool(["simulate", *LONGER, "--json"], terminal=True)
    assert rc == 0 and drawn == ""
    assert list(json.loads(out)) == JSON_KEYS


@pytest.mark.parametrize("block_size", ["1", "64"])
def test_any_block_size_runs(block_size, capsys):
    assert main(["simulate", "--backend", "reference", "--requests", "5", "--block-size",
                 block_size, "--num-blocks", "30000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 5
