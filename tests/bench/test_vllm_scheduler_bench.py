"""``kvpool bench --vllm-scheduler`` without vLLM: its child-process protocol, its summary
and table from given runs, and its refusal of runs that decided differently."""

from __future__ import annotations

import sys

import pytest

from kvpool.bench import vllm_scheduler as vs
from kvpool.bench.json_process import JsonLineProcess
from kvpool.errors import InvalidConfig

ECHO = ("import json, sys\nprint('a library talking')\n"
        "for line in sys.stdin:\n    print(json.dumps({'got': json.loads(line)}), flush=True)\n")


def test_a_json_line_process_answers_each_command_and_skips_chatter() -> None:
    child = JsonLineProcess([sys.executable, "-c", ECHO], {})
    assert child.ask({"x": 1}) == {"got": {"x": 1}}
    assert child.ask({"y": [2]}) == {"got": {"y": [2]}}
    child.close()


def test_a_child_that_dies_is_a_typed_error_with_its_stderr() -> None:
    child = JsonLineProcess([sys.executable, "-c", "import sys; sys.exit('no vLLM here')"], {})
    with pytest.raises(InvalidConfig, match="no vLLM here"):
        child.ask({"x": 1})


def run(scheduler: float, manager: float, digest: str = "d") -> dict:
    return {"steps": 100, "digest": digest, "scheduler_cpu_s": scheduler,
            "manager_cpu_s": manager, "manager_calls": 1000,
            "manager_repr": "KvpoolKVCacheManager(...)", "first_step_cpu_s": 0.002}


def test_the_summary_takes_medians_and_ratios_to_vllm() -> None:
    config = vs.SchedulerBenchConfig(python="py", kit="kit", rounds=3)
    runs = {"vllm": [run(2.0, 1.0), run(2.2, 1.2), run(9.0, 5.0)],
            "kvpool": [run(1.0, 0.25), run(1.1, 0.3), run(1.2, 0.2)]}
    result = vs._summary(config, runs, install_s=0.5, first=run(1, 1))
    assert result["ratios"]["manager"] == pytest.approx(1.2 / 0.25)
    assert result["ratios"]["scheduler"] == pytest.approx(2.2 / 1.1)
    assert result["sides"]["kvpool"]["manager_us_per_step"] == pytest.approx(2500)
    rows = vs.render_rows(result)
    assert rows[0][3] == "4.80x" and rows[0][4] == ">= 5x missed"
    assert rows[2][4] == ">= 1.6x met" and rows[-1][4] == "<= 1 s met"


def test_the_cli_refuses_bad_usage_with_exit_2(tmp_path, capsys) -> None:
    from kvpool.cli import main

    fake_python = str(tmp_path / "no-such-python")
    assert main(["bench", "--vllm-scheduler", fake_python, "--vllm-kit", str(tmp_path),
                 "--backends", ","]) == 2
    assert "names no backend" in capsys.readouterr().err
    for flags in (["--vs-vllm", fake_python, "--vllm-kit", str(tmp_path)], ["--quick"]):
        assert main(["bench", *flags, "--backends", " , "]) == 2  # every bench, alike
        assert "names no backend" in capsys.readouterr().err
    # A vLLM side that cannot start: one line on stderr, exit 2, no traceback.
    assert main(["bench", "--vllm-scheduler", fake_python, "--vllm-kit", str(tmp_path),
                 "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("kvpool bench: ") and "not an executable python" in err[-1]


def test_kv_events_reach_both_sides_and_the_title(monkeypatch, tmp_path, capsys) -> None:
    """``--kv-events`` turns events on in the setup both vLLM processes run."""
    from kvpool.cli import bench as cli_bench
    from kvpool.cli import main

    seen = {}

    def fake_bench(config, log):
        seen["config"] = config
        result = vs._summary(config, {"vllm": [run(2.0, 1.0)], "kvpool": [run(1.0, 0.5)]},
                             install_s=0.5, first=run(1, 1))
        return result

    monkeypatch.setattr(vs, "run_vllm_scheduler_bench", fake_bench)
    monkeypatch.setattr(cli_bench, "_vllm_kit", lambda args, flag: str(tmp_path))
    assert main(["bench", "--vllm-scheduler", "py", "--kv-events", "--rounds", "1"]) == 0
    assert seen["config"].kv_events is True
    assert "KV events on" in capsys.readouterr().out
    assert main(["bench", "--vllm-scheduler", "py", "--rounds", "1"]) == 0
    assert seen["config"].kv_events is False
    assert "KV events off" in capsys.readouterr().out
