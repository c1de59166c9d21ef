"""``kvpool explain``: run a short scenario and show the pool after every step.

Each step prints the free queue in order (with ref counts and hashes), the blocks in use,
the hash table, every request's block table and the step's events, as rich text; ``--png
DIR`` also draws one picture per step (``DIR/<scenario>-<step>.png``). Scenarios live in
:mod:`kvpool.explain.scenarios`. Exit status: 0; 2 bad usage (unknown scenario, a folder
that cannot be written).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from kvpool.backends import BACKENDS
from kvpool.cli._render import print_renderable
from kvpool.errors import KvPoolError
from kvpool.explain.scenarios import DEFAULT_SCENARIO, SCENARIOS


def _epilog() -> str:
    width = max(len(n) for n in SCENARIOS) + 2
    return "scenarios:\n" + "\n".join(f"  {s.name:<{width}}{s.description}"
                                      for s in SCENARIOS.values())


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="show a short scenario step by step: free queue, hash table, block tables",
        description=__doc__.splitlines()[0],
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", nargs="?", choices=list(SCENARIOS),
                        default=DEFAULT_SCENARIO, metavar="SCENARIO",
                        help=f"one of {', '.join(SCENARIOS)} (default {DEFAULT_SCENARIO})")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="spec",
                        help="the pool under the manager (spec)")
    parser.add_argument("--png", metavar="DIR", help="also draw one PNG per step into DIR")
    parser.add_argument("--json", action="store_true",
                        help="print the snapshots as JSON instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        session = SCENARIOS[args.scenario].run(args.backend)
    except KvPoolError as exc:
        print(f"kvpool explain: {exc}", file=sys.stderr)
        return 2
    snapshots = session.snapshots
    paths = []
    if args.png:
        from kvpool.explain.picture import draw_all

        try:
            paths = draw_all(snapshots, args.png, args.scenario)
        except (OSError, KvPoolError) as exc:
            print(f"kvpool explain: --png {args.png}: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps({"scenario": args.scenario,
                          "steps": [asdict(s) for s in snapshots],
                          "pictures": [str(p) for p in paths]}))
        return 0
    from kvpool.explain.render import render_text

    print_renderable(*render_text(snapshots))
    for path in paths:
        print(f"picture: {path}")
    return 0
