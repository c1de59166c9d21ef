"""``kvpool check``: differential check of backends against the spec, N steps at a time.

Calls :func:`kvpool.harness.run_check` and formats its :class:`~kvpool.harness.CheckReport`.
A progress bar goes to stderr (rich; only when stderr is a terminal and without ``--json``);
the report (a table, or ``--json``) to stdout. The seed is
always printed, so any run can be repeated with ``--seed``.

Exit status: 0 all backends agreed; 1 a divergence or invariant violation was found (the
minimal reproduction is printed as a pytest function); 2 bad usage (unknown backend, backend
not installed). ``--planted NAME`` (hidden) adds a deliberately broken pool, to watch the
harness catch it; ``--list-planted`` (hidden) names them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator

from kvpool.cli._args import block_count, non_negative_int, pool_fits, positive_int
from kvpool.cli._render import (
    grid_table,
    key_value_table,
    print_renderable,
    progress_bar,
    progress_enabled,
)
from kvpool.errors import BackendUnavailable


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        help="differential check of backends against the spec",
        description="Drive several backends with the same random operations (first = oracle) "
        "and compare results, errors, states, invariants and events after every call.",
    )
    parser.add_argument("--backends", default="spec,reference", metavar="A,B[,C]",
                        help="comma-separated backends, the first is the oracle "
                        "(spec,reference); also fast, vllm")
    parser.add_argument("--steps", type=positive_int, default=10_000, metavar="N",
                        help="rule applications to run in total (10000)")
    parser.add_argument("--seed", type=non_negative_int, default=None, metavar="S",
                        help="seed (default: random, printed)")
    parser.add_argument("--num-blocks", type=block_count, default=None, metavar="N",
                        help="pool size for every shape (default: 8-32, varied)")
    parser.add_argument("--valid-only", action="store_true",
                        help="skip BEHAVIOUR.md §12's invalid calls (pools that do not validate)")
    parser.add_argument("--no-shrink", action="store_true",
                        help="report the first failure as found, without minimising it")
    parser.add_argument("--vllm-version", metavar="V", default=None,
                        help="check the vllm backend within version V's API (default: the "
                        "installed version's, detected)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (anything else written to stdout while "
                        "checking, e.g. vLLM's log, goes to stderr)")
    parser.add_argument("--exhaustive", nargs="*", metavar="SCOPE", default=None,
                        help="instead of sampling, walk every reachable state of tiny pools "
                        "with every in-scope call (scopes: small ones by default; also "
                        "two-groups, medium, large, large-coarse, large-caching-off, all)")
    parser.add_argument("--layer", choices=("pool", "stack"), default="pool",
                        help="pool: the block pool verbs (default); stack: the whole KV cache "
                        "manager stack, per model configuration (kvpool.cli.check_stack)")
    parser.add_argument("--configuration", action="append", metavar="NAME",
                        help="--layer stack: a model configuration (repeatable; default all)")
    parser.add_argument("--planted", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--list-planted", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def _harness_progress(update: Callable[[int, int], None]) -> Callable[[int, int, float], None]:
    """The harness's ``progress(done, total, elapsed)`` driving a bar's ``update``."""
    return lambda done, total, elapsed: update(done, total)


def run(args: argparse.Namespace) -> int:
    if args.layer == "stack":
        from kvpool.cli.check_stack import run_stack

        return run_stack(args)
    from kvpool.harness import run_check
    from kvpool.harness.bugs.pool import PLANTED

    if args.exhaustive is not None:
        return run_exhaustive(args)
    if args.list_planted:
        for name, cls in PLANTED.items():
            print(f"{name:28} {cls.bug}")
        return 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.planted:
        if args.planted not in PLANTED:
            print(f"kvpool check: unknown planted bug {args.planted!r}", file=sys.stderr)
            return 2
        backends.append(f"planted:{args.planted}")
    if not backends:
        print("kvpool check: --backends names no backend", file=sys.stderr)
        return 2
    if args.num_blocks is not None:
        # The harness builds several pools per backend; one that cannot be built is
        # refused here, as usage, not reported as a divergence (MemoryError).
        why = pool_fits("--num-blocks", backends, args.num_blocks)
        if why:
            print(f"kvpool check: {why}", file=sys.stderr)
            return 2
    if args.vllm_version:
        backends = [f"vllm:{args.vllm_version}" if b == "vllm" else b for b in backends]
    enabled = progress_enabled(args.json)
    try:
        with _stdout_to_stderr(args.json), progress_bar("check", enabled) as update:
            report = run_check(
                backends,
                args.steps,
                args.seed,
                num_blocks=args.num_blocks,
                invalid_calls=not args.valid_only,
                shrink=not args.no_shrink,
                progress=_harness_progress(update) if enabled else None,
            )
    except BackendUnavailable as exc:
        print(f"kvpool check: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print_report(report)
    return 0 if report.ok else 1


def run_exhaustive(args: argparse.Namespace) -> int:
    """``kvpool check --exhaustive [SCOPE ...]``: counts of states and transitions per scope."""
    from kvpool.verify.exhaustive import LARGE_SCOPES, SCOPES, SMALL_SCOPES, explore

    names = args.exhaustive or [s.name for s in SMALL_SCOPES]
    if names == ["all"]:
        names = [s.name for s in SMALL_SCOPES + LARGE_SCOPES]
    unknown = [n for n in names if n not in SCOPES]
    if unknown:
        print(f"kvpool check: unknown scope(s) {', '.join(unknown)}; known: "
              f"{', '.join(SCOPES)}", file=sys.stderr)
        return 2
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.backends == "spec,reference":  # the sampling default; exhaustive checks all three
        backends = ["spec", "reference", "fast"]
    if args.planted:
        backends.append(f"planted:{args.planted}")
    try:
        reports = [explore(SCOPES[n], backends) for n in names]
    except BackendUnavailable as exc:
        print(f"kvpool check: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.to_json() for r in reports]))
    else:
        header = ["verdict", "scope", "states", "transitions", "accepted", "rejected",
                  "depth", "time"]
        rows = [["ok" if r.ok else "FAILED", r.scope, f"{r.states:,}", f"{r.transitions:,}",
                 f"{r.accepted:,}", f"{r.rejected:,}", str(r.depth), f"{r.seconds:.1f} s"]
                for r in reports]
        print_renderable(grid_table(header, rows, title="exhaustive check", right_from=2))
        for r in reports:
            if r.failure:
                print(f"{r.scope}:")
                print(r.failure)
    return 0 if all(r.ok for r in reports) else 1


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """Send file descriptor 1 to stderr while checking, so ``--json`` prints only JSON.

    At the descriptor level: vLLM 0.25.1's logging handler holds the original ``sys.stdout``
    object, which Python-level redirection would not catch.
    """
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def summary_rows(report) -> list[tuple[str, str]]:
    """The check's figures as (what, value) rows."""
    rows = [
        ("backends", f"{', '.join(report.backends)} (oracle: {report.backends[0]})"),
        ("seed", f"{report.seed}"),
        ("steps", f"{report.steps:,} in {report.examples:,} examples, {report.elapsed_s:.1f} s "
                  f"({report.steps_per_s:,.0f} steps/s)"),
        ("divergences", f"{report.divergences}"),
        ("invariant violations", f"{report.invariant_violations}"),
        ("PYTHONHASHSEED", f"{report.hash_seed}"),
    ]
    if report.not_generated:
        rows.append(("not generated", "outside a backend's API: "
                     + ", ".join(report.not_generated)))
    for what, calls in report.documented_deviations.items():
        rows.append(("documented deviation", f"tolerated in {calls} call(s): {what}"))
    return rows


def print_report(report) -> None:
    """The summary table, then (on failure) the failure and its reproduction as plain text,
    so that it can be pasted as it is."""
    verdict = "all backends agree" if report.ok else "DIVERGENCE"
    print_renderable(key_value_table(summary_rows(report), title=f"kvpool check: {verdict}"))
    if not report.ok:
        print(f"first failure after {report.steps_to_first_divergence} steps"
              + (f", in rule {report.failure_rule}:" if report.failure_rule else ":"))
        print(report.failure or "")
        if report.reproduction and report.reproduction not in (report.failure or ""):
            print("\nMinimal reproduction:")
            print(report.reproduction)
