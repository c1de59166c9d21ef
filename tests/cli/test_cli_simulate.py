"""``kvpool simulate``: summary, ``--json`` keys, and exit 2 without a traceback on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvpool.backends import BACKENDS
from kvpool.cli import main
from kvpool.workload import synthetic_trace, write_trace

JSON_KEYS = {"requests", "prompt_tokens", "hit_tokens", "hit_rate", "evictions", "peak_usage",
             "pool_s", "wall_s"}
SMALL = ["--backend", "spec", "--requests", "8", "--num-blocks", "512"]


def test_the_summary_names_every_figure(capsys):
    assert main(["simulate", *SMALL]) == 0
    out = capsys.readouterr().out
    for label in ("requests", "prompt tokens", "prefix hits", "evictions", "peak usage",
                  "pool time", "wall time"):
        assert label in out


def test_json_prints_one_object_with_the_documented_keys(capsys):
    assert main(["simulate", *SMALL, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert JSON_KEYS <= set(record)
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


@pytest.mark.parametrize("args", [["--backend", "nope"], ["--num-blocks", "0"]])
def test_bad_usage_exits_2(args):
    with pytest.raises(SystemExit) as info:
        main(["simulate", *args])
    assert info.value.code == 2
