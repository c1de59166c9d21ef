"""Class 11 of issue 7: hostile CLI input is one line on stderr naming the argument or
``FILE:LINE``, exit 2, never a traceback (class 10 for ``--num-blocks`` beyond memory)."""

from __future__ import annotations

import json

import pytest

from kvpool.cli import main

HUGE = str(10**13)


def one_line_usage_error(capsys, argv: list[str], *needles: str) -> str:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own usage errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    for needle in needles:
        assert needle in last, last
    return last


@pytest.mark.parametrize("line, reason", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (json.dumps({"id": "a\ud800", "arrival_step": 0, "prompt": [1], "output_len": 1}),
     "lone surrogate"),
    (json.dumps({"id": "a", "arrival_step": 0, "prompt": [2**70], "output_len": 1}),
     "'prompt'[0]"),
])
def test_a_hostile_trace_line_is_reported_at_file_and_line(tmp_path, capsys, line, reason):
    path = tmp_path / "t.jsonl"
    ok = json.dumps({"id": "ok", "arrival_step": 0, "prompt": [1, 2], "output_len": 1})
    path.write_text(f"{ok}\n{line}\n")
    one_line_usage_error(capsys, ["simulate", "--trace", str(path), "--backend", "spec"],
                         f"{path}:2:", reason)


@pytest.mark.parametrize("command", ["check", "simulate"])
def test_a_single_block_pool_is_a_usage_error(capsys, command):
    one_line_usage_error(capsys, [command, "--num-blocks", "1"], "--num-blocks", "at least 2")


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_a_pool_beyond_memory_is_a_usage_error_not_a_divergence(capsys, backend):
    one_line_usage_error(capsys, ["check", "--backends", f"spec,{backend}", "--steps", "5",
                                  "--num-blocks", HUGE], "--num-blocks", "GiB")
    one_line_usage_error(capsys, ["simulate", "--backend", backend, "--num-blocks", HUGE],
                         "--num-blocks", "MemAvailable")
