"""``kvpool bench``: benchmarks of each backend against the reference, in one run.

Calls :func:`kvpool.bench.run_bench` and prints its tables (or, with ``--json``, one object
``{"<suite>": {"<backend>": {"<figure>": value}}, "ratios": {...}, "targets": [...],
"meta": {...}}``). ``--quick`` shrinks every size so a run takes seconds (targets are then
not evaluated). Exit status: 0 done; 1 two backends' replays disagreed, or ``--check`` and a
measured target was missed; 2 bad usage or input (unknown backend, backend not installed,
malformed trace).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from kvpool.bench import SUITES, BenchConfig, ReplayDivergence, run_bench
from kvpool.bench.runner import hashing_available
from kvpool.bench.vllm_scheduler import MODELS as SCHEDULER_MODELS
from kvpool.cli._args import non_negative_int, positive_int
from kvpool.cli._render import grid_table, print_renderable
from kvpool.errors import KvPoolError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark backends against the reference",
        description="Medians of --repeat runs per figure, after a warm-up reported apart, "
        "with each backend's ratio to the reference measured in the same run.",
    )
    parser.add_argument("--suite", choices=(*SUITES, "all"), default="all")
    parser.add_argument("--backends", default="fast,reference", metavar="LIST",
                        help="comma-separated backends (fast,reference)")
    parser.add_argument("--trace", metavar="FILE", help="JSONL trace for the trace suite")
    parser.add_argument("--repeat", type=positive_int, default=5, metavar="K",
                        help="timed runs per figure; figures are medians (5)")
    parser.add_argument("--seed", type=non_negative_int, default=0, metavar="S",
                        help="seed of every generated workload (0)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke tests)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a measured target is missed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--vs-vllm", metavar="PYTHON", default=None,
                        help="instead: kvpool against the real vLLM, with this vLLM venv "
                        "python (default $KVPOOL_VLLM_PYTHON when given without the suites; "
                        "see benchmarks/README.md)")
    parser.add_argument("--vllm-scheduler", metavar="PYTHON", default=None,
                        help="instead: kvpool's manager inside vLLM's real scheduler against "
                        "vLLM's own, with this vLLM venv python (docs/vllm.md)")
    parser.add_argument("--requests", type=positive_int, default=None, metavar="N",
                        help="--vllm-scheduler: the first N requests of the chat trace (2000)")
    parser.add_argument("--model", choices=SCHEDULER_MODELS, default="full",
                        help="--vllm-scheduler: the model's KV cache groups (full: one "
                        "full-attention group; full+swa: and a sliding window; full+mamba: "
                        "and Mamba)")
    parser.add_argument("--kv-events", action="store_true",
                        help="--vllm-scheduler: KV cache events on (what a KV-aware router "
                        "subscribes to), on both sides")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="--vllm-scheduler: vLLM's AsyncScheduler, stepped as its engine "
                        "core steps it (the next batch scheduled while the last is in "
                        "flight; the default of vLLM's engines)")
    parser.add_argument("--by-method", action="store_true",
                        help="--vllm-scheduler: also time the manager per public method, and "
                        "allocate_slots per kind of call (admission, idle step, a step that "
                        "takes or fills a block, refused), on both sides (a second table)")
    parser.add_argument("--vllm-kit", metavar="DIR", default=None,
                        help="the vLLM kit directory with bench.py and gen_trace.py "
                        "($KVPOOL_VLLM_KIT, else ../shared/vllm-kit)")
    parser.add_argument("--rounds", type=positive_int, default=3, metavar="R",
                        help="--vs-vllm: interleaved rounds; figures are medians (3)")
    parser.add_argument("--no-micro", action="store_true",
                        help="--vs-vllm: no micro loops")
    parser.add_argument("--micro-slices", type=positive_int, default=5, metavar="K",
                        help="--vs-vllm: micro loops per round as K short runs alternating "
                        "between the sides (5)")
    parser.add_argument("--no-construct", action="store_true",
                        help="--vs-vllm: no 1M-block construction (fresh processes)")
    parser.set_defaults(func=run)


def _vllm_kit(args: argparse.Namespace, flag: str) -> str | None:
    """The kit directory (``--vllm-kit``, ``$KVPOOL_VLLM_KIT`` or ``../shared/vllm-kit``);
    ``None`` after saying on stderr that ``flag`` needs one."""
    from kvpool.bench.vs_vllm import default_kit

    kit = args.vllm_kit or default_kit()
    if not kit:
        print(f"kvpool bench: {flag} needs the vLLM kit (--vllm-kit DIR or $KVPOOL_VLLM_KIT)",
              file=sys.stderr)
    return kit


def _against_vllm(args: argparse.Namespace, flag: str, divergence: type[BaseException],
                  measure: Callable[[Callable[[str], None]], dict[str, Any]]
                  ) -> tuple[int, dict[str, Any] | None]:
    """``measure(log)`` with a phase line (a live status on a terminal, one log line per
    phase elsewhere: a CI log shows where a long comparison is); the exit status and the
    result: 1 when the sides decided differently, 2 for bad input or a failed side."""
    from kvpool.cli._render import phase_status, progress_enabled

    try:
        with phase_status(f"kvpool bench {flag}", progress_enabled(args.json)) as log:
            return 0, measure(log)
    except divergence as exc:
        print(f"kvpool bench: {exc}", file=sys.stderr)
        return 1, None
    except (KvPoolError, OSError) as exc:
        print(f"kvpool bench: {exc}", file=sys.stderr)
        return 2, None


def _backend_names(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The names ``--backends`` lists; ``None`` (after one line on stderr) if it lists none."""
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    if not backends:
        print("kvpool bench: --backends names no backend", file=sys.stderr)
        return None
    return backends


def run_vs_vllm(args: argparse.Namespace) -> int:
    from kvpool.bench.vs_vllm import VllmDivergence, VsVllmConfig, run_vs_vllm

    kit = _vllm_kit(args, "--vs-vllm")
    if not kit:
        return 2
    backends = _backend_names(args)
    if backends is None:
        return 2
    config = VsVllmConfig(python=args.vs_vllm, kit=kit, backends=backends, rounds=args.rounds,
                          micro=not args.no_micro, micro_slices=args.micro_slices,
                          construct=not args.no_construct)
    status, result = _against_vllm(args, "--vs-vllm", VllmDivergence,
                                   lambda log: run_vs_vllm(config, log=log))
    if result is None:
        return status
    if args.json:
        print(json.dumps(result))
    else:
        print_vs_vllm(result)
    return 0


def run_vllm_scheduler(args: argparse.Namespace) -> int:
    from kvpool.bench.vllm_scheduler import (
        SchedulerBenchConfig,
        SchedulerDivergence,
        render_method_rows,
        render_rows,
        run_vllm_scheduler_bench,
    )

    kit = _vllm_kit(args, "--vllm-scheduler")
    if not kit:
        return 2
    backends = _backend_names(args)
    if backends is None:
        return 2
    config = SchedulerBenchConfig(python=args.vllm_scheduler, kit=kit, backend=backends[0],
                                  rounds=args.rounds, num_requests=args.requests,
                                  model=args.model, kv_events=args.kv_events,
                                  by_method=args.by_method,
                                  async_scheduling=args.async_scheduling)
    status, result = _against_vllm(args, "--vllm-scheduler", SchedulerDivergence,
                                   lambda log: run_vllm_scheduler_bench(config, log=log))
    if result is None:
        return status
    if args.json:
        print(json.dumps(result))
        return 0
    w = result["workload"]
    model = "" if w.get("model", "full") == "full" else f"{w['model']} model, "
    if w.get("async_scheduling"):
        model = f"async scheduling, {model}"
    print_renderable(grid_table(
        ["figure", "vLLM", f"kvpool ({result['backend']})", "vLLM / kvpool", "target"],
        render_rows(result),
        title=f"vLLM's scheduler, {model}chat trace ({w['requests']:,} requests, {w['steps']:,} "
        f"steps, {w['num_blocks']:,} blocks, KV events {'on' if w.get('kv_events') else 'off'}), "
        f"CPU clock, medians of {result['rounds']} "
        f"rounds; same decisions (digest {result['digest']})"))
    if "by_method" in result:
        print_renderable(grid_table(
            ["method", "calls (vLLM / kvpool)", "vLLM per call", "vLLM in all", "kvpool per call",
             "kvpool in all", "vLLM / kvpool"],
            render_method_rows(result),
            title="the KV manager per public method and, indented, allocate_slots per kind of "
            "call (outermost calls, CPU clock, medians)"))
    print(f"kvpool side: {result['manager']}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.vllm_scheduler:
        return run_vllm_scheduler(args)
    if args.vs_vllm:
        return run_vs_vllm(args)
    if args.suite == "all":
        suites = [s for s in SUITES if s != "hashing" or hashing_available()]
    else:
        suites = [args.suite]
    backends = _backend_names(args)
    if backends is None:
        return 2
    config = BenchConfig(
        backends=backends, repeat=args.repeat, quick=args.quick, trace=args.trace, seed=args.seed
    )
    from kvpool.cli._render import progress_bar, progress_enabled

    try:
        with progress_bar("kvpool bench", progress_enabled(args.json), unit="suites") as update:
            update(0, len(suites))
            results = run_bench(config, suites, on_progress=update)
    except ReplayDivergence as exc:
        print(f"kvpool bench: {exc}", file=sys.stderr)
        return 1
    except (KvPoolError, OSError) as exc:
        print(f"kvpool bench: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results))
    else:
        print_results(results)
    missed = [t for t in results["targets"] if t["met"] is False]
    return 1 if args.check and missed else 0


def print_results(results: dict[str, Any]) -> None:
    """One table per suite (figures × backends, then each backend's ratio to the
    reference), then the targets."""
    from kvpool.bench.report import headline, suite_tables, target_rows

    print(headline(results))
    tables = [grid_table(header, rows, title=f"suite: {suite}")
              for suite, header, rows in suite_tables(results)]
    targets = target_rows(results)
    if targets:
        rows = [[name, value if value is not None else "-", verdict]
                for name, value, verdict in targets]
        tables.append(grid_table(["target (fast backend)", "measured", "verdict"], rows,
                                 title="targets", left=(2,)))
    print_renderable(*tables)


def print_vs_vllm(result: dict[str, Any]) -> None:
    """kvpool against the real vLLM: one row per figure and clock, CPU rows first."""
    from kvpool.bench.vs_vllm import footer, row_cells

    columns = result["meta"]["backends"]
    header = ["figure", "clock", "vLLM"]
    for c in columns:
        header += [c, f"{c} ratio"]
    header.append("target (fast, cpu)")
    rows = [row_cells(row, columns) for row in result["rows"]]
    print_renderable(grid_table(header, rows, title="kvpool against the real vLLM", left=(1,)))
    print(footer(result))
