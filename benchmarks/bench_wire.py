"""KV events on the wire: publisher throughput and the pool-time overhead of publishing.

    python benchmarks/bench_wire.py [--requests 2000] [--backend fast] [--repeat 5] [--json]

Beside vLLM's own publisher and encoder (ratios), run it under a vLLM 0.33 kit's python:

    PYTHONPATH=src:/tmp/anchors/vllm033/kvpool-deps VLLM_LOGGING_LEVEL=WARNING \\
        /tmp/anchors/vllm033/venv/bin/python benchmarks/bench_wire.py

What is measured and how: :mod:`kvpool.wire.bench`.
"""

from __future__ import annotations

import argparse
import json

from kvpool.wire.bench import run_wire_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--backend", default="fast")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--port", type=int, default=55761, help="two TCP ports from here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run_wire_bench(num_requests=args.requests, backend=args.backend,
                            repeat=args.repeat, port=args.port)
    if args.json:
        print(json.dumps(result))
        return
    for name, value in result.items():
        if name == "medians":
            for key, v in value.items():
                print(f"  median {key:<40} {v:.4f}")
        elif isinstance(value, float):
            print(f"{name:<48} {value:,.2f}")
        else:
            print(f"{name:<48} {value}")


if __name__ == "__main__":
    main()
