"""``kvpool contracts``: search for counterexamples to the spec's contracts with CrossHair.

Exit status: 0 every contract was searched to its budget and none has a counterexample;
1 a counterexample was found, or a contract could not be checked (CrossHair error, timeout,
budget exhausted); 2 bad usage. See ``docs/contracts.md`` for what a clean run means.
"""

from __future__ import annotations

import argparse
import json
import math

DEFAULT_TIMEOUT_S = 180.0
"""Total wall-clock budget of a default run (the CI run)."""

PER_CONTRACT_SHARE = 0.5
"""Fraction of a contract's slot spent searching; the rest absorbs start-up and machine load."""


def per_condition_budget(timeout_s: float, num_contracts: int, workers: int) -> float:
    """CPU seconds per contract so that ``num_contracts`` fit in ``timeout_s`` on ``workers``."""
    rounds = math.ceil(num_contracts / max(1, workers))
    return max(1.0, round(PER_CONTRACT_SHARE * timeout_s / max(1, rounds), 1))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "contracts",
        help="check the spec's contracts with CrossHair",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
        help=f"total wall-clock budget in seconds (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--per-condition", type=float, default=None, metavar="S",
        help="CPU seconds of search per contract (default: the budget split over contracts)",
    )
    parser.add_argument("--workers", type=int, default=2, help="contracts checked in parallel")
    parser.add_argument(
        "--only", action="append", metavar="OP", default=None,
        help="check only this operation's contract (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvpool.verify.crosshair_check import contract_names, run_contracts

    known = contract_names()
    targets = args.only or known
    unknown = sorted(set(targets) - set(known))
    if unknown or args.timeout <= 0 or args.workers < 1:
        problem = f"unknown operation(s): {', '.join(unknown)}" if unknown else "bad budget"
        print(f"kvpool contracts: {problem} (operations: {', '.join(known)})")
        return 2
    per_condition = args.per_condition or per_condition_budget(
        args.timeout, len(targets), args.workers
    )
    report = run_contracts(args.timeout, per_condition, targets, workers=args.workers)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for r in report.results:
            states = f"{r.states_built} states" if r.states_built is not None else "-"
            print(f"{r.status:<18} {r.seconds:6.1f} s  {states:>12}  {r.target}")
            for message in r.counterexamples:
                print(f"    {message}")
            if r.detail:
                print(f"    {r.detail.splitlines()[-1] if r.detail.strip() else ''}")
        print(
            f"{len(report.contracts_checked)}/{len(report.results)} contracts checked, "
            f"{len(report.counterexamples)} counterexample(s), {report.seconds:.0f} s "
            f"({per_condition:g} s of search each, {args.workers} at a time)"
        )
    return 0 if report.ok else 1
