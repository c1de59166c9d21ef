"""Run the kvpool benchmark suites and print (or save) the results.

A thin wrapper over :func:`kvpool.bench.run_bench` (the same as ``kvpool bench``), adding
``--out FILE`` to keep the JSON next to the printed tables. See benchmarks/README.md for the
method and the targets.

    python benchmarks/run_all.py                      # every suite, fast vs reference, 5 runs
    python benchmarks/run_all.py --suite trace --repeat 3 --out trace.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    from kvpool.bench import SUITES, BenchConfig, format_results, run_bench
except ModuleNotFoundError:  # running from a checkout without installing kvpool
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from kvpool.bench import SUITES, BenchConfig, format_results, run_bench
from kvpool.bench.runner import hashing_available


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=(*SUITES, "all"), default="all")
    parser.add_argument("--backends", default="fast,reference")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", help="JSONL trace for the trace suite")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", help="also write the JSON result to this file")
    args = parser.parse_args(argv)
    if args.suite == "all":
        suites = [s for s in SUITES if s != "hashing" or hashing_available()]
    else:
        suites = [args.suite]
    config = BenchConfig(
        backends=tuple(args.backends.split(",")),
        repeat=args.repeat,
        quick=args.quick,
        trace=args.trace,
        seed=args.seed,
    )
    results = run_bench(config, suites)
    print(format_results(results))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    return 1 if any(t["met"] is False for t in results["targets"]) else 0


if __name__ == "__main__":
    sys.exit(main())
