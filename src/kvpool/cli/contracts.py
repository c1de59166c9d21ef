"""``kvpool contracts``: search for counterexamples to the spec's contracts with CrossHair.

Every contract gets a budget of **CPU seconds** (not wall time), so a loaded machine reaches
the same verdict as an idle one, only later. Exit status: 0 every contract was searched to
its budget and none has a counterexample; 1 a counterexample was found (its broken
invariant or postcondition clause is named); 3 no counterexample, but some contract did not
reach its budget (stopped by the wall-clock safety net or the ``--deadline``); 4 CrossHair
itself failed on some contract; 2 bad usage. See ``docs/contracts.md``.
"""

from __future__ import annotations

import argparse
import json

DEFAULT_CPU_S = 10.0
"""CPU seconds of search per operation contract (the CI run)."""

DEFAULT_PRECONDITION_CPU_S = 8.0
"""CPU seconds per precondition contract: they are small (one precondition, its §12 rows)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "contracts",
        help="check the spec's contracts with CrossHair",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--per-condition", type=float, default=DEFAULT_CPU_S, metavar="S",
        help=f"CPU seconds of search per operation contract (default {DEFAULT_CPU_S:g})",
    )
    parser.add_argument(
        "--per-precondition", type=float, default=DEFAULT_PRECONDITION_CPU_S, metavar="S",
        help="CPU seconds per precondition contract "
        f"(default {DEFAULT_PRECONDITION_CPU_S:g})",
    )
    parser.add_argument(
        "--deadline", type=float, default=None, metavar="S",
        help="optional overall wall-clock deadline: contracts not started by then are "
        "reported not-finished (exit 3)",
    )
    parser.add_argument("--workers", type=int, default=2, help="contracts checked in parallel")
    parser.add_argument(
        "--only", action="append", metavar="NAME", default=None,
        help="check only this contract (an operation, <op>_rejection, or a focused "
        "contract such as free_blocks_releasing); repeatable",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvpool.verify.crosshair_check import contract_names, run_contracts

    known = contract_names()
    targets = args.only or known
    unknown = sorted(set(targets) - set(known))
    budgets = (args.per_condition, args.per_precondition, args.deadline or 1.0)
    if unknown or min(budgets) <= 0 or args.workers < 1:
        problem = f"unknown contract(s): {', '.join(unknown)}" if unknown else "bad budget"
        print(f"kvpool contracts: {problem} (contracts: {', '.join(known)})")
        return 2
    from kvpool.cli._render import progress_bar, progress_enabled

    with progress_bar("CrossHair", progress_enabled(args.json), unit="contracts") as update:
        update(0, len(targets))
        report = run_contracts(args.deadline, args.per_condition, targets,
                               workers=args.workers, precondition_timeout=args.per_precondition,
                               on_progress=update)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        from kvpool.cli._render import grid_table, print_renderable

        rows = [[r.target, r.status, f"{r.budget_s:g} s", f"{r.seconds:.1f} s",
                 f"{r.states_built:,}" if r.states_built is not None else "-"]
                for r in report.results]
        print_renderable(grid_table(["contract", "status", "CPU budget", "wall", "paths"],
                                    rows, title="kvpool contracts (CrossHair)", left=(1,)))
        for r in report.results:
            for message, broken in zip(r.counterexamples, r.explanations, strict=False):
                print(f"{r.target}: broken: {broken or '(see message)'}")
                print(f"    {message}")
            if r.detail and r.detail.strip():
                print(f"{r.target}: {r.detail.splitlines()[-1]}")
        print(
            f"{len(report.contracts_checked)}/{len(report.results)} contracts checked, "
            f"{len(report.counterexamples)} counterexample(s), "
            f"{len(report.problems)} without a verdict, {report.seconds:.0f} s wall "
            f"({args.per_condition:g} s CPU per operation contract, "
            f"{args.per_precondition:g} s per precondition contract, {args.workers} at a time)"
        )
    return report.exit_status
