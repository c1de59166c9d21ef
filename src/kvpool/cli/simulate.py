"""``kvpool simulate``: replay a serving workload through the KV cache manager; summarise it.

Calls :func:`kvpool.workload.simulate` (a :class:`~kvpool.policy.KVCacheManager` for
``--model`` over a ``--backend`` pool, driven by :mod:`kvpool.workload.serving`) and prints
a table. Without ``--trace`` it replays a built-in ``--workload`` (``--requests``,
``--seed``). ``--json`` prints exactly the documented keys; ``--plot FILE`` draws usage,
hit rate and evictions per step; ``--compare A,B`` replays on each backend, prints one
table and fails (exit 1) unless every decision is the same.

Exit status: 0 success; 1 ``--compare`` found backends deciding differently; 2 bad input
(malformed trace line, unreadable file, impossible sizes, a pool too small for a request,
backend not installed), reported as one line on stderr without a traceback.

``--publish ENDPOINT`` also publishes the KV events on vLLM's ZeroMQ wire while it replays,
one batch per scheduler step (:mod:`kvpool.cli._publish`, :mod:`kvpool.wire`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from kvpool.backends import BACKENDS
from kvpool.cli._args import block_count, non_negative_int, pool_fits, positive_int
from kvpool.cli._publish import add_publish_arguments, published_rows, publishing
from kvpool.cli._render import (
    ProgressUpdate,
    grid_table,
    key_value_table,
    print_renderable,
    progress_bar,
    progress_enabled,
)
from kvpool.errors import KvPoolError
from kvpool.workload.models import MODELS
from kvpool.workload.serving import ServingReport
from kvpool.workload.simulate import DEFAULT_MAX_RUNNING, DEFAULT_NUM_BLOCKS, simulate
from kvpool.workload.workloads import DEFAULT_WORKLOAD, WORKLOADS

MAX_BLOCK_SIZE = 1 << 16
"""Largest ``--block-size`` accepted (vLLM's are 16 to a few hundred tokens)."""


def _epilog() -> str:
    lines = ["workloads (--workload):"]
    width = max(len(n) for n in (*WORKLOADS, *MODELS)) + 2
    lines += [f"  {w.name:<{width}}{w.description} [{w.default_requests} requests]"
              for w in WORKLOADS.values()]
    lines.append("models (--model):")
    lines += [f"  {m.name:<{width}}{m.description}" for m in MODELS.values()]
    return "\n".join(lines)


def _block_size(text: str) -> int:
    value = positive_int(text)
    if value > MAX_BLOCK_SIZE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_BLOCK_SIZE}, got {text}")
    return value


def _backend_list(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if len(names) < 2 or unknown:
        raise argparse.ArgumentTypeError(
            f"needs two or more of {', '.join(sorted(BACKENDS))}, comma-separated, got {text!r}")
    return names


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay a serving workload through the KV cache manager",
        description="Replay a workload (default: the built-in chat trace) through a KV cache "
        "manager over a block pool; print requests, tokens, prefix-hit rate, evictions, "
        "preemptions, peak and mean usage, pool time and wall time.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trace", metavar="FILE",
                        help="JSONL trace to replay instead of a built-in workload")
    parser.add_argument("--workload", choices=list(WORKLOADS), default=None,
                        help=f"built-in workload (default {DEFAULT_WORKLOAD}; see below)")
    parser.add_argument("--model", choices=list(MODELS), default="full",
                        help="model shape: its KV cache groups (default full; see below)")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="fast")
    parser.add_argument("--num-blocks", type=block_count, default=DEFAULT_NUM_BLOCKS,
                        metavar="N", help=f"pool size, null block included ({DEFAULT_NUM_BLOCKS})")
    parser.add_argument("--block-size", type=_block_size, default=16, metavar="B",
                        help="tokens per block (16)")
    parser.add_argument("--max-running", type=positive_int, default=DEFAULT_MAX_RUNNING,
                        metavar="R", help=f"concurrent requests ({DEFAULT_MAX_RUNNING})")
    parser.add_argument("--seed", type=non_negative_int, default=0, metavar="S",
                        help="seed of the built-in workload (0)")
    parser.add_argument("--requests", type=positive_int, default=None, metavar="N",
                        help="requests in the built-in workload (its default, below)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: " + ", ".join(ServingReport.JSON_FIELDS))
    parser.add_argument("--plot", metavar="PNG",
                        help="also draw usage, hit rate and evictions per step to this PNG")
    parser.add_argument("--compare", type=_backend_list, metavar="A,B",
                        help="replay on each backend (e.g. fast,reference); one table; "
                        "exit 1 unless they make the same decisions")
    add_publish_arguments(parser)
    parser.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"kvpool simulate: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    backends = args.compare or [args.backend]
    why = pool_fits("--num-blocks", backends, args.num_blocks)
    if why:
        return _fail(why)
    if args.compare and args.publish:
        return _fail("--compare and --publish cannot be combined (one event stream)")
    if args.trace and args.requests is not None:
        return _fail("--requests sizes a built-in workload; it cannot apply to --trace")
    if args.trace and args.workload is not None:
        return _fail("--workload and --trace both name what to replay: choose one")
    args.workload = args.workload or DEFAULT_WORKLOAD
    if args.plot:
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            return _fail(f"--plot {args.plot}: no such directory {folder}")
    reports: list[ServingReport] = []
    published = None
    try:
        with publishing(args) as pub:
            for backend in backends:
                reports.append(_simulate_one(args, backend,
                                             {} if pub is None else pub.simulate_options()))
            published = None if pub is None else pub.finish()
        if args.plot:
            from kvpool.workload.plot import plot_report

            plot_report(reports[0], args.plot)
    except (KvPoolError, OSError) as exc:
        return _fail(str(exc))
    if args.compare:
        return _print_comparison(args, reports)
    report = reports[0]
    if args.json:
        record: dict[str, Any] = report.summary()
        if published is not None:
            record["publisher"] = published
        print(json.dumps(record))
        return 0
    rows = summary_rows(report, _source(args))
    if published is not None:
        rows += published_rows(published)
    print_renderable(key_value_table(rows))
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def _simulate_one(args: argparse.Namespace, backend: str,
                  options: dict[str, Any]) -> ServingReport:
    label = f"simulate {backend}" if args.compare else "simulate"
    with progress_bar(label, progress_enabled(args.json), unit="requests") as bar:
        notice = _CompileNotice(bar, label)
        with _compile_hook(notice):
            return simulate(
                args.trace, backend=backend, num_blocks=args.num_blocks,
                block_size=args.block_size, max_running=args.max_running, seed=args.seed,
                num_requests=args.requests, workload=args.workload, model=args.model,
                on_step=notice.on_step, **options)


class _CompileNotice:
    """The first run on a cold Numba disk cache compiles the fast kernels (seconds each): the
    bar says which one it is waiting for, and a line above it says what it took once the
    replay starts. Nothing when the bar is not drawn (not a terminal, ``--json``)."""

    def __init__(self, bar: ProgressUpdate, label: str) -> None:
        self.bar = bar
        self.label = label
        self.kernels = 0
        self.seconds = 0.0

    def __call__(self, name: str, seconds: float | None) -> None:
        if seconds is None:
            self.bar.describe(f"{self.label}: first run, compiling kernel {name} into "
                              f"Numba's disk cache ({self.kernels} done)")
        else:
            self.kernels += 1
            self.seconds += seconds

    def on_step(self, done: int, total: int) -> None:
        if self.kernels:
            self.bar.describe(self.label)
            plural = "s" * (self.kernels > 1)
            self.bar.note(f"compiled {self.kernels} kernel{plural} into Numba's disk cache in "
                          f"{self.seconds:.1f} s (first run only; later runs load them)")
            self.kernels, self.seconds = 0, 0.0
        self.bar(done, total)


def _compile_hook(hook: Callable[[str, float | None], None]) -> AbstractContextManager[None]:
    """:func:`kvpool.fast.compiled.compile_hook`, or nothing without numba (no compiling)."""
    try:
        from kvpool.fast.compiled import compile_hook
    except ImportError:
        return contextlib.nullcontext()
    return compile_hook(hook)


def _source(args: argparse.Namespace) -> str:
    if args.trace:
        return args.trace
    return f"built-in {args.workload} workload (seed {args.seed})"


def summary_rows(report: ServingReport, source: str) -> list[tuple[str, str]]:
    """The human-readable summary of one replay, as (what, value) rows."""
    r = report
    per_call_us = r.pool_s / r.pool_calls * 1e6 if r.pool_calls else 0.0
    return [
        ("workload", source),
        ("model", f"{r.model}  ({MODELS[r.model].description})"),
        ("backend", f"{r.backend}  ({r.num_blocks} blocks of {r.block_size} tokens, "
                    f"<= {r.max_running} running)"),
        ("policy", f"{r.policy}  ("
                   f"{'kvpool.policy.fast' if r.policy == 'fast' else 'the generic policy'})"),
        ("requests", f"{r.requests:,}  ({r.steps:,} steps)"),
        ("prompt tokens", f"{r.prompt_tokens:,}"),
        ("generated tokens", f"{r.decode_tokens:,}"),
        ("prefix hits", f"{r.hit_tokens:,} tokens = {r.hit_rate:.1%} of prompt tokens"),
        ("blocks allocated", f"{r.blocks_allocated:,}"),
        ("evictions", f"{r.evictions:,} cached blocks reallocated"),
        ("preemptions", f"{r.preemptions:,}"),
        ("peak usage", f"{r.peak_usage:.1%} of the usable blocks"),
        ("mean usage", f"{r.mean_usage:.1%} over steps"),
        ("pool time", f"{r.pool_s:.3f} s  ({r.pool_calls:,} manager calls, "
                      f"{per_call_us:.2f} us/call)"),
        ("wall time", f"{r.wall_s:.3f} s  (+ warm-up {r.warmup_s:.3f} s)"),
    ]


COMPARED = ("requests", "prompt_tokens", "decode_tokens", "hit_tokens", "blocks_allocated",
            "evictions", "preemptions", "steps", "peak_usage", "mean_usage", "pool_s", "wall_s")


def _cell(name: str, value: Any) -> str:
    if name.endswith("_usage"):
        return f"{value:.2%}"
    if name.endswith("_s"):
        return f"{value:.3f} s"
    return f"{value:,}"


def _print_comparison(args: argparse.Namespace, reports: list[ServingReport]) -> int:
    first = reports[0].decisions()
    differing = sorted({k for r in reports[1:] for k, v in r.decisions().items()
                        if first.get(k) != v})
    same = not differing
    if args.json:
        print(json.dumps({"backends": {r.backend: r.summary() for r in reports},
                          "same_decisions": same, "differing": differing}))
    else:
        header = ["figure", *(r.backend for r in reports)]
        rows = [[name, *(_cell(name, getattr(r, name)) for r in reports)] for name in COMPARED]
        base = reports[0]
        rows += [[f"pool time vs {base.backend}",
                  *(f"{base.pool_s / r.pool_s:.2f}x" if r.pool_s else "-" for r in reports)]]
        verdict = "same decisions" if same else "DIFFERENT decisions: " + ", ".join(differing)
        print_renderable(grid_table(header, rows, title=f"{_source(args)}, model "
                                    f"{args.model}: {verdict}"))
    if not same:
        print(f"kvpool simulate: backends decided differently ({', '.join(differing)})",
              file=sys.stderr)
        return 1
    return 0
