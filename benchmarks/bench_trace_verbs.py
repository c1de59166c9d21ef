"""Pool time of the kit trace on one backend, both API shapes: ``python
benchmarks/bench_trace_verbs.py [--kit ../shared/vllm-kit] [--rounds 5] [--json]``.

Rounds interleave the two shapes: the batch verbs (:func:`kvpool.workload.driver.replay`,
one ``admit`` per admission attempt and one ``step`` per scheduler step) and vLLM's call
pattern (:func:`kvpool.bench.vllm_pattern.replay_vllm_pattern`, one call per lookup or block
batch). Each figure is the median over the rounds: ``pool_cpu_s`` and ``hash_cpu_s`` on the
thread's CPU clock, ``admit_s`` / ``step_s`` the batch verbs' wall time per verb, and the
vLLM pattern's ``pattern_pool_s`` (CPU clock). No vLLM is needed: this is the kvpool side of
``kvpool bench --vs-vllm`` alone, for comparing two kvpool versions (run it once per checkout,
alternating, on a quiet machine) or for profiling.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

try:
    from kvpool.backends import make_pool
except ModuleNotFoundError:  # running from a checkout without installing kvpool
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from kvpool.backends import make_pool
from kvpool.bench import vllm_pattern
from kvpool.bench.vs_vllm import load_kit_trace
from kvpool.hashing import BlockHasher
from kvpool.workload.driver import HASH_SEED, replay
from kvpool.workload.trace import TraceRequest


def _pool(backend: str):
    gc.collect()
    return make_pool(vllm_pattern.NUM_BLOCKS, backend=backend, hash_block_size=vllm_pattern.BLOCK)


def one_round(backend: str, kit_trace: list, trace: list[TraceRequest]) -> dict[str, float]:
    """One batch-verb replay and one vLLM-pattern replay; their time figures."""
    report = replay(_pool(backend), trace, block_size=vllm_pattern.BLOCK,
                    max_running=vllm_pattern.MAX_RUNNING,
                    hasher=BlockHasher("sha256", seed=HASH_SEED))
    pattern = vllm_pattern.replay_vllm_pattern(
        _pool(backend), kit_trace, BlockHasher("sha256", seed=HASH_SEED), time.thread_time)
    return {
        "pool_cpu_s": report.pool_cpu_s,
        "hash_cpu_s": report.hash_cpu_s,
        "admit_s": report.verb_s.get("admit", 0.0),
        "step_s": report.verb_s.get("step", 0.0),
        "pattern_pool_s": pattern["pool_s"],
        "pattern_hash_s": pattern["hash_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", default="../shared/vllm-kit", help="the vLLM kit directory")
    parser.add_argument("--backend", default="fast")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    kit_trace = load_kit_trace(args.kit)
    trace = [TraceRequest(rid, arrival, tuple(prompt), len(outputs))
             for rid, arrival, prompt, outputs in kit_trace]
    one_round(args.backend, kit_trace[:50], trace[:50])  # warm-up: kernels compile or load
    rounds = [one_round(args.backend, kit_trace, trace) for _ in range(args.rounds)]
    medians = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    if args.json:
        print(json.dumps({"median": medians, "rounds": rounds}))
    else:
        for name, value in medians.items():
            print(f"{name:16s} {value * 1e3:9.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
