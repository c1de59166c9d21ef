"""Facade trace benchmark: kvpool's KVCacheManager (reference, fast) vs vLLM's own, same run.

Run with the vLLM kit's python, kvpool's dependencies beside it (see docs/policy.md)::

    PYTHONPATH=src:/tmp/anchors/vllm025/kvpool-deps VLLM_LOGGING_LEVEL=WARNING \\
        /tmp/anchors/vllm025/venv/bin/python benchmarks/bench_facade_trace.py \\
        --requests 2000 --repeat 3 [--json]

``--no-vllm`` runs kvpool's facades alone (any python). See
:mod:`kvpool.bench.facade_trace` for the method.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvpool.bench.facade_trace import MODELS, run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--backends", default="reference,fast")
    parser.add_argument("--model", action="append", choices=MODELS)
    parser.add_argument("--kit-dir", default=None,
                        help="the vLLM kit (default: $KVPOOL_VLLM_KIT, else ../shared/vllm-kit)")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(tuple(args.model or MODELS), tuple(args.backends.split(",")),
                 args.requests, args.repeat, args.num_blocks, args.kit_dir,
                 with_vllm=not args.no_vllm, log=lambda s: print(s, file=sys.stderr))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['requests']} requests, {result['num_blocks']} blocks, "
          f"median of {result['repeat']} interleaved rounds (facade calls only)")
    for model, figures in result["models"].items():
        print(f"\n{model}")
        for name, f in figures.items():
            ratio = "" if "vs_vllm_wall" not in f else \
                f"  x{f['vs_vllm_wall']:.2f} wall, x{f['vs_vllm_cpu']:.2f} CPU vs vLLM"
            print(f"  {name:10} wall {f['wall_s']:8.3f} s  cpu {f['cpu_s']:8.3f} s  "
                  f"{f['calls']} calls, {f['blocks_allocated']} blocks, "
                  f"{f['hit_tokens']} hit tokens, {f['preemptions']} preemptions{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
