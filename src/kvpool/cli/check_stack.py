"""``kvpool check --layer stack``: the whole-stack differential check, per configuration.

Calls :func:`kvpool.harness.stack.run.run_stack_check` once per model configuration
(:data:`kvpool.harness.stack.configs.CONFIGURATIONS`, all by default) with ``--steps`` steps
each and prints one line per configuration, or ``--json``. A backend name is a pool backend
under the generic policy; ``fast-policy`` is :mod:`kvpool.policy.fast` over the fast pool,
built only in the configurations it serves (the others list it as not built). Exit status:
0 when every configuration reported 0 divergences, 1 otherwise (the failure, with the seed
and the ops leading to it, is printed), 2 bad usage. ``--planted NAME`` (hidden) adds a stack with a
planted policy bug (:mod:`kvpool.harness.bugs.stack`) and runs only its configuration;
``--list-planted`` names them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from kvpool.cli._render import grid_table, print_renderable, progress_bar, progress_enabled
from kvpool.errors import BackendUnavailable


def run_stack(args: argparse.Namespace) -> int:
    from kvpool.harness.bugs.stack import PLANTED_POLICY
    from kvpool.harness.stack.configs import CONFIGURATIONS
    from kvpool.harness.stack.run import run_stack_check

    if args.list_planted:
        for name, bug in PLANTED_POLICY.items():
            print(f"{name:36} [{bug.configuration}] {bug.bug}")
        return 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends:
        print("kvpool check: --backends names no backend", file=sys.stderr)
        return 2
    extra = []
    names = args.configuration or list(CONFIGURATIONS)
    if args.planted:
        planted = PLANTED_POLICY.get(args.planted)
        if planted is None:
            print(f"kvpool check: unknown planted policy bug {args.planted!r}", file=sys.stderr)
            return 2
        extra = [planted.stack()]
        names = args.configuration or [planted.configuration]
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        print(f"kvpool check: unknown configuration {unknown[0]!r}; known: "
              f"{', '.join(CONFIGURATIONS)}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    reports = []
    for name in names:
        try:
            with progress_bar(name, progress_enabled(args.json)) as update:
                report = run_stack_check(name, backends, args.steps, seed, extra,
                                         lambda done: update(done, args.steps))
        except BackendUnavailable as exc:
            print(f"kvpool check: {exc}", file=sys.stderr)
            return 2
        reports.append(report)
    if args.json:
        print(json.dumps({"layer": "stack", "backends": backends, "seed": seed,
                          "configurations": [r.to_json() for r in reports]}))
        return 0 if all(r.ok for r in reports) else 1
    rows = [[name, f"{r.steps:,}", str(r.divergences), f"{r.elapsed_s:.1f} s",
             ", ".join([f"{k} {v}" for k, v in sorted(r.coverage.items())]
                       + [f"{s} not built (does not serve it)" for s in r.skipped])]
            for name, r in zip(names, reports, strict=True)]
    print_renderable(grid_table(["configuration", "steps", "divergences", "time", "coverage"],
                                rows, title=f"kvpool check --layer stack ({', '.join(backends)},"
                                f" seed {seed})", right_from=1, left=(4,)))
    for name, r in zip(names, reports, strict=True):
        if r.failure:
            print(f"{name}:")
            print(r.failure)
    return 0 if all(r.ok for r in reports) else 1


__all__ = ["run_stack"]
