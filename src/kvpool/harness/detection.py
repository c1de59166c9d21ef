"""How many steps each planted pool bug takes to be found: ``python -m kvpool.harness.detection``.

Every bug of :data:`kvpool.harness.bugs.pool.PLANTED` is run against an oracle (the spec by
default) for up to ``--steps`` random steps; the table shows the step of the first divergence
and exits 1 if any bug was not found.
"""

from __future__ import annotations

import argparse

from kvpool.harness.bugs.pool import PLANTED
from kvpool.harness.check import run_check


def steps_to_detection(names=None, *, steps: int = 20_000, seed: int = 0,
                       oracle: str = "spec") -> dict[str, int | None]:
    """For each planted bug, the step at which a check against ``oracle`` first failed."""
    out: dict[str, int | None] = {}
    for name in names or PLANTED:
        report = run_check([oracle, f"planted:{name}"], steps, seed, shrink=False)
        out[name] = report.steps_to_first_divergence
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="steps until each planted bug is found")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--oracle", default="spec")
    args = parser.parse_args(argv)
    missed = 0
    for name, found in steps_to_detection(steps=args.steps, seed=args.seed,
                                          oracle=args.oracle).items():
        missed += found is None
        shown = "NOT FOUND" if found is None else f"{found} steps"
        print(f"{name:28} {shown:>12}   {PLANTED[name].bug}")
    return 1 if missed else 0


__all__ = ["main", "steps_to_detection"]

if __name__ == "__main__":
    raise SystemExit(main())
