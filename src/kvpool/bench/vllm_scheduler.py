"""``kvpool bench --vllm-scheduler PYTHON``: the KV manager where users feel it, inside
vLLM's real scheduler.

Two long-lived processes of the vLLM venv's python run :mod:`kvpool.vllm.scheduler_run` on
the same workload (the vLLM kit's chat trace by default: 2,000 requests, 64 running, 20,000
blocks, prefix caching on): one with vLLM's own ``KVCacheManager``, one with kvpool's
(:func:`kvpool.vllm.install`). Each side first runs the trace once untimed (warm-up); then
``rounds`` timed runs alternate between the sides, so a slow spell of the shared machine hits
both. Per run, on the thread's CPU clock: the scheduler step (``schedule`` +
``update_from_output``) and the KV manager's share of it (its public methods, outermost
calls only), building and adding the requests (where vLLM's hasher hashes the prompts and
the drop-in's also packs them: work moved out of the manager is shown, not hidden), plus
the decisions digest of the run, which must be equal on both sides (a run
whose digests differ is a divergence, exit 1). Figures are medians over the rounds.

The kvpool side also reports what an engine pays at start: the seconds :func:`install`
took (a warm Numba disk cache: loading, not compiling) and the CPU time of the first
scheduler step. Each side's Numba cache lives beside its kit (``<kit>/numba-cache``): the
cache is per Numba version, and the kit's Numba is not the checkout's.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.bench.json_process import JsonLineProcess
from kvpool.errors import InvalidConfig

MODELS = ("full", "full+swa", "full+mamba")
"""The model families :mod:`kvpool.vllm.scheduler_run` builds: one full-attention group
(the default), full attention + a 1,024-token sliding window, full attention + Mamba
(``align``)."""


class SchedulerDivergence(AssertionError):
    """vLLM's scheduler decided differently with kvpool's manager."""


@dataclass(frozen=True)
class SchedulerBenchConfig:
    python: str
    kit: str
    backend: str = "fast"
    policy: str = "auto"
    rounds: int = 3
    num_requests: int | None = None
    num_blocks: int = 20_000
    model: str = "full"
    kv_events: bool = False
    by_method: bool = False
    """Also time the manager per public method (on both sides; each call then adds to its
    method's totals, so the whole-trace figures of such a run read a little closer to 1)."""
    async_scheduling: bool = False
    """vLLM's ``AsyncScheduler`` (the default of its engines), stepped as its engine core
    steps it: the next batch is scheduled while the last one is in flight."""


class _Side(JsonLineProcess):
    """One vLLM process answering :mod:`kvpool.vllm.scheduler_run` commands."""

    name = "the vLLM scheduler process"

    def __init__(self, python: str, kit: str) -> None:
        if not os.access(python, os.X_OK) or os.path.isdir(python):
            raise InvalidConfig(f"--vllm-scheduler: {python!r} is not an executable python "
                                f"(a vLLM venv's, e.g. /tmp/anchors/vllm025/venv/bin/python)")
        # <kit>/venv/bin/python (not resolved: a venv's python is a link to the base one);
        # kvpool's dependencies and the Numba cache live beside the venv.
        venv_root = Path(os.path.abspath(python)).parent.parent.parent
        src = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src),
                                                           str(venv_root / "kvpool-deps")]),
                   PYTHONHASHSEED="0", VLLM_LOGGING_LEVEL="ERROR", HF_HUB_OFFLINE="1",
                   KVPOOL_VLLM_KIT=kit, NUMBA_CACHE_DIR=str(venv_root / "numba-cache"))
        super().__init__([python, "-m", "kvpool.vllm.scheduler_run"], env)


def run_vllm_scheduler_bench(config: SchedulerBenchConfig,
                             log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Both sides, warmed up, then ``rounds`` alternating timed runs (module docstring)."""
    workload = {"kit": config.kit, "num_requests": config.num_requests}
    if config.model not in MODELS:
        raise InvalidConfig(f"model must be one of {', '.join(MODELS)}, got {config.model!r}")
    setup = {"num_blocks": config.num_blocks, "kv_events": config.kv_events,
             "model": config.model, "async_scheduling": config.async_scheduling}
    base = {"setup": setup, "workload": workload, "timing": True,
            "by_method": config.by_method}
    log("starting vLLM (two processes)")
    stock, ours = _Side(config.python, config.kit), _Side(config.python, config.kit)
    try:
        install = ours.ask({"install_only": True, "backend": config.backend})
        kvpool_cmd = dict(base, manager="kvpool", backend=config.backend, policy=config.policy)
        log("warm-up: one untimed run per side")
        first = ours.ask(kvpool_cmd)
        stock.ask(dict(base, manager="vllm"))
        runs: dict[str, list[dict[str, Any]]] = {"vllm": [], "kvpool": []}
        for r in range(config.rounds):
            log(f"round {r + 1} of {config.rounds}")
            runs["vllm"].append(stock.ask(dict(base, manager="vllm")))
            runs["kvpool"].append(ours.ask(kvpool_cmd))
    finally:
        stock.close()
        ours.close()
    digests = {side: {run["digest"] for run in rs} for side, rs in runs.items()}
    if len(digests["vllm"] | digests["kvpool"]) != 1:
        raise SchedulerDivergence(
            f"vLLM's scheduler decided differently with kvpool's manager: digests {digests}")
    return _summary(config, runs, install["install_s"], first)


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def _summary(config: SchedulerBenchConfig, runs: dict[str, list[dict[str, Any]]],
             install_s: float, first: dict[str, Any]) -> dict[str, Any]:
    steps = runs["vllm"][0]["steps"]
    sides = {}
    for side, rs in runs.items():
        sched, manager = _median(rs, "scheduler_cpu_s"), _median(rs, "manager_cpu_s")
        sides[side] = {"scheduler_cpu_s": sched, "manager_cpu_s": manager,
                       # less what the clock put into each call (kvpool.vllm.manager_clock)
                       "manager_net_cpu_s": _median(rs, "manager_net_cpu_s"),
                       "clock_share_ns": 1e9 * _median(rs, "manager_clock_share_s"),
                       "requests_cpu_s": _median(rs, "requests_cpu_s"),
                       "scheduler_us_per_step": 1e6 * sched / steps,
                       "manager_us_per_step": 1e6 * manager / steps,
                       "manager_share": manager / sched if sched else 0.0,
                       "manager_calls": rs[0]["manager_calls"],
                       "runs_scheduler_cpu_s": [r["scheduler_cpu_s"] for r in rs],
                       "runs_manager_cpu_s": [r["manager_cpu_s"] for r in rs]}
    v, k = sides["vllm"], sides["kvpool"]
    by_method = _by_method(runs) if config.by_method else None
    return {
        "workload": {"requests": config.num_requests or 2000, "steps": steps,
                     "num_blocks": config.num_blocks, "model": config.model,
                     "kv_events": config.kv_events,
                     "async_scheduling": config.async_scheduling},
        "backend": config.backend, "manager": runs["kvpool"][0]["manager_repr"],
        "rounds": config.rounds, "digest": runs["vllm"][0]["digest"], "sides": sides,
        "ratios": {"manager": v["manager_cpu_s"] / k["manager_cpu_s"],
                   "manager_net": v["manager_net_cpu_s"] / k["manager_net_cpu_s"]
                   if k["manager_net_cpu_s"] else 0.0,
                   "scheduler": v["scheduler_cpu_s"] / k["scheduler_cpu_s"]},
        "ratio_ranges": {"manager": _round_ratios(runs, "manager_cpu_s"),
                         "scheduler": _round_ratios(runs, "scheduler_cpu_s")},
        "targets": {"manager": 5.0, "scheduler": 1.6, "first_step_s": 1.0},
        "start": {"install_s": install_s, "first_step_cpu_s": first["first_step_cpu_s"]},
        **({"by_method": by_method} if by_method is not None else {}),
    }


def _round_ratios(runs: dict[str, list[dict[str, Any]]], key: str) -> tuple[float, float]:
    """The lowest and highest vLLM / kvpool ratio of one round (its two runs ran back to back):
    how far a shared machine moves the figure between rounds."""
    ratios = [v[key] / k[key] for v, k in zip(runs["vllm"], runs["kvpool"], strict=True)
              if k[key]]
    return (min(ratios), max(ratios)) if ratios else (0.0, 0.0)


def _by_method(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per manager method: its calls on each side (equal decisions, so equal but for the
    methods one manager calls from another) and the median CPU microseconds per call."""
    out: dict[str, dict[str, Any]] = {}
    names = {n for rs in runs.values() for r in rs for n in r.get("manager_by_method", {})}
    for name in sorted(names):
        row: dict[str, Any] = {}
        for side, rs in runs.items():
            seen = [r["manager_by_method"][name] for r in rs
                    if name in r.get("manager_by_method", {})]
            row[f"{side}_calls"] = seen[0]["calls"] if seen else 0
            row[f"{side}_cpu_s"] = statistics.median(m["cpu_s"] for m in seen) if seen else 0.0
            row[f"{side}_us_per_call"] = (1e6 * row[f"{side}_cpu_s"] / row[f"{side}_calls"]
                                          if row[f"{side}_calls"] else 0.0)
        out[name] = row
    return out


def render_method_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per manager method, costliest on vLLM's side first: calls (vLLM's, then
    kvpool's where they differ), CPU per call and in all on each side, and the ratio of the
    totals. A method's kinds of call (``"method / kind"``, ``allocate_slots``'s) follow its
    row, indented, costliest first."""
    figures = result.get("by_method", {})
    by_cost = sorted(figures.items(), key=lambda kv: -kv[1]["vllm_cpu_s"])
    rows = []
    for name, m in by_cost:
        if " / " in name:
            continue
        rows.append(_method_row(name, m))
        rows.extend(_method_row("  " + kind.split(" / ", 1)[1], k) for kind, k in by_cost
                    if kind.startswith(name + " / "))
    return rows


def _method_row(label: str, m: dict[str, Any]) -> list[str]:
    ratio = m["vllm_cpu_s"] / m["kvpool_cpu_s"] if m["kvpool_cpu_s"] else 0.0
    calls = f"{m['vllm_calls']:,}"
    if m["kvpool_calls"] != m["vllm_calls"]:  # one manager calls it from another
        calls += f" / {m['kvpool_calls']:,}"
    return [label, calls, f"{m['vllm_us_per_call']:.2f} us", f"{1e3 * m['vllm_cpu_s']:.1f} ms",
            f"{m['kvpool_us_per_call']:.2f} us", f"{1e3 * m['kvpool_cpu_s']:.1f} ms",
            f"{ratio:.2f}x" if ratio else ""]


def render_rows(result: dict[str, Any]) -> list[list[str]]:
    """The table rows of a result: figure, vLLM, kvpool, ratio, target."""
    v, k = result["sides"]["vllm"], result["sides"]["kvpool"]
    r, t = result["ratios"], result["targets"]
    ranges = result.get("ratio_ranges", {})

    def verdict(ratio: float, goal: float) -> str:
        return f">= {goal:g}x {'met' if ratio >= goal else 'missed'}"

    def spread(name: str) -> str:
        lo, hi = ranges.get(name, (0.0, 0.0))
        return f"{lo:.2f}-{hi:.2f}x" if result["rounds"] > 1 and hi else ""

    return [
        ["KV manager CPU, whole trace", f"{v['manager_cpu_s']:.3f} s",
         f"{k['manager_cpu_s']:.3f} s", f"{r['manager']:.2f}x",
         verdict(r["manager"], t["manager"])],
        ["  ratio, lowest-highest round", "", "", spread("manager"), ""],
        ["  less the clock's own cost", f"{v['manager_net_cpu_s']:.3f} s",
         f"{k['manager_net_cpu_s']:.3f} s", f"{r['manager_net']:.2f}x",
         f"({v['clock_share_ns']:.0f} / {k['clock_share_ns']:.0f} ns a call)"],
        ["KV manager CPU per step", f"{v['manager_us_per_step']:.0f} us",
         f"{k['manager_us_per_step']:.0f} us", f"{r['manager']:.2f}x", ""],
        ["scheduler step CPU", f"{v['scheduler_us_per_step']:.0f} us",
         f"{k['scheduler_us_per_step']:.0f} us", f"{r['scheduler']:.2f}x",
         verdict(r["scheduler"], t["scheduler"])],
        ["  ratio, lowest-highest round", "", "", spread("scheduler"), ""],
        ["manager share of the step", f"{100 * v['manager_share']:.0f} %",
         f"{100 * k['manager_share']:.0f} %", "", ""],
        ["requests built and added, CPU", f"{v['requests_cpu_s']:.3f} s",
         f"{k['requests_cpu_s']:.3f} s", f"{v['requests_cpu_s'] / k['requests_cpu_s']:.2f}x"
         if k["requests_cpu_s"] else "", "(hashing; kvpool's also packs)"],
        ["install() (warm disk cache)", "", f"{result['start']['install_s']:.2f} s", "", ""],
        ["first scheduler step CPU", "",
         f"{1e3 * result['start']['first_step_cpu_s']:.1f} ms", "",
         f"<= {t['first_step_s']:g} s "
         f"{'met' if result['start']['first_step_cpu_s'] <= t['first_step_s'] else 'missed'}"],
    ]


__all__ = ["SchedulerBenchConfig", "SchedulerDivergence", "render_method_rows", "render_rows",
           "run_vllm_scheduler_bench"]
