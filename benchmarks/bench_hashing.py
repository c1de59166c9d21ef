"""Block-hashing throughput per algorithm: ``python benchmarks/bench_hashing.py``.

Hashes one seeded chain of 16-token blocks with every installed algorithm (vLLM's four and
kvpool's raw modes) and prints blocks per second, median of ``--repeat`` runs, with the ratio
to ``sha256``, vLLM's default. The measurement itself is
:func:`kvpool.hashing.bench.run_hashing_bench`; this script only parses arguments and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from kvpool.hashing.bench import format_hashing_bench, run_hashing_bench
except ModuleNotFoundError:  # running from a checkout without installing kvpool
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from kvpool.hashing.bench import format_hashing_bench, run_hashing_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-blocks", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="seed of the token generator")
    parser.add_argument(
        "--algorithm",
        action="append",
        dest="algorithms",
        metavar="NAME",
        help="measure only this algorithm (repeatable)",
    )
    args = parser.parse_args(argv)
    print(
        f"# {args.num_blocks} blocks of {args.block_size} tokens, median of {args.repeat} "
        f"runs, token seed {args.seed}"
    )
    results = run_hashing_bench(
        args.num_blocks,
        args.repeat,
        block_size=args.block_size,
        algorithms=args.algorithms,
        seed=args.seed,
    )
    print(format_hashing_bench(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
