"""What one Python call into the fast pool costs, split into method, entry and kernel work:
``python benchmarks/call_floor.py``. The measurement is :mod:`kvpool.bench.call_floor`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    from kvpool.bench.call_floor import format_call_floor, run_call_floor
except ModuleNotFoundError:  # running from a checkout without installing kvpool
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from kvpool.bench.call_floor import format_call_floor, run_call_floor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000, help="operations per timed loop")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run_call_floor(ops=args.ops, rounds=args.rounds)
    print(json.dumps(result, indent=1) if args.json else format_call_floor(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
