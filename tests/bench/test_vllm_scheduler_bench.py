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


def run(scheduler: float, manager: float, digest: str = "d", requests: float = 0.5) -> dict:
    # The clock's own cost: 100 ns on each of the 1000 calls.
    return {"steps": 100, "digest": digest, "scheduler_cpu_s": scheduler,
            "manager_cpu_s": manager, "manager_calls": 1000, "requests_cpu_s": requests,
            "manager_clock_share_s": 1e-7, "manager_net_cpu_s": manager - 1e-4,
            "manager_repr": "KvpoolKVCacheManager(...)", "first_step_cpu_s": 0.002}


def test_the_summary_takes_medians_and_ratios_to_vllm() -> None:
    config = vs.SchedulerBenchConfig(python="py", kit="kit", rounds=3)
    runs = {"vllm": [run(2.0, 1.0), run(2.2, 1.2), run(9.0, 5.0)],
            "kvpool": [run(1.0, 0.25, requests=0.6), run(1.1, 0.3, requests=0.7),
                       run(1.2, 0.2, requests=0.4)]}
    result = vs._summary(config, runs, install_s=0.5, first=run(1, 1))
    assert result["ratios"]["manager"] == pytest.approx(1.2 / 0.25)
    assert result["ratios"]["scheduler"] == pytest.approx(2.2 / 1.1)
    assert result["sides"]["kvpool"]["manager_us_per_step"] == pytest.approx(2500)
    # Each round's two runs as a pair: the ratio's spread over rounds.
    assert result["ratio_ranges"]["manager"] == pytest.approx((1.2 / 0.3, 5.0 / 0.2))
    rows = {row[0]: row for row in vs.render_rows(result)}
    assert rows["KV manager CPU, whole trace"][3:] == ["4.80x", ">= 5x missed"]
    # The raw sums judge the target; the net ones are shown beside them.
    assert result["ratios"]["manager_net"] == pytest.approx((1.2 - 1e-4) / (0.25 - 1e-4))
    assert rows["  less the clock's own cost"][1:] == [
        "1.200 s", "0.250 s", "4.80x", "(100 / 100 ns a call)"]
    assert rows["scheduler step CPU"][4] == ">= 1.6x met"
    assert rows["first scheduler step CPU"][4] == "<= 1 s met"
    # Work the drop-in moves out of the manager (packing the prompt's digests) is shown.
    assert rows["requests built and added, CPU"][1:4] == ["0.500 s", "0.600 s", "0.83x"]
    assert [row[3] for row in vs.render_rows(result) if "lowest" in row[0]] == [
        "4.00-25.00x", "2.00-7.50x"]


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


def test_async_scheduling_reaches_both_sides_and_the_title(monkeypatch, tmp_path,
                                                          capsys) -> None:
    """``--async-scheduling`` makes both vLLM processes run the AsyncScheduler (the
    driver's ``Setup.async_scheduling``); without it both run the synchronous one."""
    from kvpool.cli import bench as cli_bench
    from kvpool.cli import main

    seen: dict[str, list] = {"setups": []}

    def fake_ask(self, command):
        if "setup" in command:
            seen["setups"].append(command["setup"])
        return run(1.0, 0.5) | {"install_s": 0.1, "digest": "d", "manager_repr": "k"}

    monkeypatch.setattr(vs._Side, "__init__", lambda self, python, kit: None)
    monkeypatch.setattr(vs._Side, "ask", fake_ask)
    monkeypatch.setattr(vs._Side, "close", lambda self: None)
    monkeypatch.setattr(cli_bench, "_vllm_kit", lambda args, flag: str(tmp_path))
    assert main(["bench", "--vllm-scheduler", "py", "--async-scheduling", "--rounds", "1"]) == 0
    assert seen["setups"] and all(s["async_scheduling"] is True for s in seen["setups"])
    assert "async scheduling" in capsys.readouterr().out
    seen["setups"].clear()
    assert main(["bench", "--vllm-scheduler", "py", "--rounds", "1"]) == 0
    assert seen["setups"] and all(s["async_scheduling"] is False for s in seen["setups"])
    assert "async scheduling" not in capsys.readouterr().out


def test_the_model_reaches_both_sides_and_the_title(monkeypatch, tmp_path, capsys) -> None:
    """``--model full+swa`` sets the model both vLLM processes build; an unknown one is
    refused by the parser (exit 2) and by the benchmark itself (a typed error)."""
    from kvpool.cli import bench as cli_bench
    from kvpool.cli import main

    seen = {}

    def fake_ask(self, command):
        seen.setdefault("setups", []).append(command.get("setup"))
        return run(1.0, 0.5) | {"install_s": 0.1, "digest": "d", "manager_repr": "k"}

    monkeypatch.setattr(vs._Side, "__init__", lambda self, python, kit: None)
    monkeypatch.setattr(vs._Side, "ask", fake_ask)
    monkeypatch.setattr(vs._Side, "close", lambda self: None)
    monkeypatch.setattr(cli_bench, "_vllm_kit", lambda args, flag: str(tmp_path))
    assert main(["bench", "--vllm-scheduler", "py", "--model", "full+swa", "--rounds", "1"]) == 0
    setups = [s for s in seen["setups"] if s is not None]
    assert setups and all(s["model"] == "full+swa" for s in setups)
    assert "full+swa model" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["bench", "--vllm-scheduler", "py", "--model", "mamba-only"])
    with pytest.raises(InvalidConfig, match="model must be one of full, full\\+swa"):
        vs.run_vllm_scheduler_bench(vs.SchedulerBenchConfig(python="py", kit="k",
                                                            model="mamba-only"))
    assert vs.MODELS == ("full", "full+swa", "full+mamba")


def test_the_manager_clock_counts_outermost_calls_per_method() -> None:
    from kvpool.vllm.manager_clock import ManagerClock

    class Manager:
        def free(self, request):
            return self.get_blocks(request)  # an inner call: counted in free only

        def get_blocks(self, request_id):
            return [request_id]

    plain, by_method = Manager(), Manager()
    ManagerClock(plain)
    clock = ManagerClock(by_method, by_method=True)
    for manager in (plain, by_method):
        assert manager.free("r") == ["r"] and manager.get_blocks("s") == ["s"]
        manager.free("t")
    assert clock.calls == 3 and clock.seconds > 0
    assert {name: calls for name, (_, calls) in clock.by_method.items() if calls} == {
        "free": 2, "get_blocks": 1}
    assert sum(seconds for seconds, _ in clock.by_method.values()) == pytest.approx(
        clock.seconds)


def method_run(scheduler: float, manager: float, free_s: float, calls: int = 10) -> dict:
    return {**run(scheduler, manager),
            "manager_by_method": {"free": {"cpu_s": free_s, "calls": calls},
                                  "allocate_slots": {"cpu_s": manager - free_s, "calls": 90}}}


def test_by_method_takes_medians_per_method_and_reaches_the_cli(monkeypatch, tmp_path,
                                                                capsys) -> None:
    from kvpool.cli import bench as cli_bench
    from kvpool.cli import main

    config = vs.SchedulerBenchConfig(python="py", kit="kit", rounds=3, by_method=True)
    runs = {"vllm": [method_run(2.0, 1.0, 0.2), method_run(2.0, 1.0, 0.4),
                     method_run(2.0, 1.0, 0.3)],
            "kvpool": [method_run(1.0, 0.5, 0.1), method_run(1.0, 0.5, 0.05),
                       method_run(1.0, 0.5, 0.5)]}
    result = vs._summary(config, runs, install_s=0.5, first=run(1, 1))
    free = result["by_method"]["free"]
    assert free["vllm_cpu_s"] == pytest.approx(0.3) and free["kvpool_cpu_s"] == pytest.approx(0.1)
    assert free["vllm_us_per_call"] == pytest.approx(3e4) and free["kvpool_calls"] == 10
    rows = vs.render_method_rows(result)
    assert [r[0] for r in rows] == ["allocate_slots", "free"]  # costliest on vLLM first
    assert rows[1][-1] == "3.00x" and rows[1][1] == "10"
    runs["kvpool"][0]["manager_by_method"]["free"]["calls"] = 12  # counted from another call
    result = vs._summary(config, runs, install_s=0.5, first=run(1, 1))
    assert vs.render_method_rows(result)[1][1] == "10 / 12"
    assert "by_method" not in vs._summary(vs.SchedulerBenchConfig(python="py", kit="kit"),
                                          runs, install_s=0.5, first=run(1, 1))

    seen = {}

    def fake_bench(config, log):
        seen["config"] = config
        return vs._summary(config, runs, install_s=0.5, first=run(1, 1))

    monkeypatch.setattr(vs, "run_vllm_scheduler_bench", fake_bench)
    monkeypatch.setattr(cli_bench, "_vllm_kit", lambda args, flag: str(tmp_path))
    assert main(["bench", "--vllm-scheduler", "py", "--by-method", "--rounds", "3"]) == 0
    assert seen["config"].by_method is True
    out = capsys.readouterr().out
    assert "per public method" in out and "allocate_slots" in out
    assert main(["bench", "--vllm-scheduler", "py", "--rounds", "3"]) == 0
    assert seen["config"].by_method is False
    assert "per public method" not in capsys.readouterr().out


def test_the_clock_measures_its_own_cost_per_call() -> None:
    """What the bracket adds to a call that does nothing: more than nothing (a clock read and
    the forwarding cost something), far less than a microsecond's worth of a manager call."""
    from kvpool.vllm.manager_clock import ManagerClock

    share = ManagerClock.calibrate(rounds=3, calls=2000)
    assert 0 < share < 2e-6


class _Blocks:
    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self, allow_none=False):
        return None if allow_none and not any(self.ids) else self.ids


@pytest.mark.parametrize("admission, result, computed, new, kind", [
    (True, _Blocks(([3, 4],)), 0, 40, "admission"),
    (True, None, 0, 40, "admission, refused"),
    (False, None, 20, 1, "step, refused"),
    (False, _Blocks(([],)), 20, 1, "step, nothing taken or filled"),
    (False, _Blocks(([],)), 31, 1, "step that fills a block"),
    (False, _Blocks(([7],)), 32, 1, "step that takes a block"),
    (False, _Blocks(([7],)), 30, 4, "step that takes and fills a block"),
])
def test_an_allocate_slots_call_is_told_by_what_it_did(admission, result, computed, new,
                                                       kind) -> None:
    from kvpool.vllm.manager_clock import allocate_kind

    assert allocate_kind(admission, result, computed, new, 16) == kind


def test_the_manager_clock_times_allocate_slots_per_kind_too() -> None:
    """Each outermost allocate_slots is counted under its method and its kind, the kinds add
    up to the method; the waiting queue's call (it passes the lookup's hits) is an
    admission, whether by keyword or by position."""
    from types import SimpleNamespace

    from kvpool.vllm.manager_clock import ManagerClock

    class Manager:
        def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                           new_computed_blocks=None, num_lookahead_tokens=0):
            return _Blocks(([1],) if num_new_tokens > 1 else ([],))

    m = Manager()
    clock = ManagerClock(m, by_method=True, block_size=16)
    r = SimpleNamespace(num_computed_tokens=0)
    m.allocate_slots(r, 20, num_new_computed_tokens=0, new_computed_blocks=_Blocks(([],)))
    m.allocate_slots(r, 20, 0, _Blocks(([],)))
    r.num_computed_tokens = 20
    m.allocate_slots(r, 1, num_lookahead_tokens=0)
    counts = {name: int(calls) for name, (_, calls) in clock.by_method.items() if calls}
    assert counts == {"allocate_slots": 3, "allocate_slots / admission": 2,
                      "allocate_slots / step, nothing taken or filled": 1}
    assert sum(s for name, (s, _) in clock.by_method.items() if " / " in name) == \
        pytest.approx(clock.by_method["allocate_slots"][0])


def test_the_method_table_puts_each_methods_kinds_under_it() -> None:
    def figures(vllm_s, kvpool_s, calls):
        return {"vllm_calls": calls, "kvpool_calls": calls, "vllm_cpu_s": vllm_s,
                "kvpool_cpu_s": kvpool_s, "vllm_us_per_call": 1e6 * vllm_s / calls,
                "kvpool_us_per_call": 1e6 * kvpool_s / calls}

    result = {"by_method": {
        "free": figures(0.5, 0.2, 10),
        "allocate_slots": figures(1.0, 0.3, 100),
        "allocate_slots / admission": figures(0.4, 0.1, 10),
        "allocate_slots / step, nothing taken or filled": figures(0.6, 0.2, 90)}}
    rows = vs.render_method_rows(result)
    assert [row[0] for row in rows] == ["allocate_slots", "  step, nothing taken or filled",
                                        "  admission", "free"]
    assert rows[2][-1] == "4.00x"


@pytest.mark.parametrize("bad", [0, -3, 2.0, "16", None])
def test_the_clock_refuses_bad_sizes_with_a_typed_error(bad) -> None:
    from kvpool.errors import InvalidArgument
    from kvpool.vllm.manager_clock import ManagerClock, allocate_kind

    class Manager:
        def free(self, request):
            return None

    manager = Manager()
    method = manager.free
    with pytest.raises(InvalidArgument):
        allocate_kind(False, None, 0, 1, bad)
    with pytest.raises(InvalidArgument):
        ManagerClock.calibrate(rounds=bad)
    with pytest.raises(InvalidArgument):
        ManagerClock.calibrate(calls=bad)
    if bad != 0:  # 0 is the clock's "no kinds of call"
        with pytest.raises(InvalidArgument):
            ManagerClock(manager, by_method=True, block_size=bad)
        assert manager.free == method  # nothing wrapped
