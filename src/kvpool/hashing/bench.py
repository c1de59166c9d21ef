"""Throughput of each hash algorithm on chained blocks (the library side of a benchmark).

Every algorithm hashes the same seeded token sequence as one chain of full blocks with no
extra keys, through :meth:`BlockHasher.hash_blocks` (what the request hasher calls). Each
algorithm gets one untimed warm-up pass, then ``repeat`` timed passes taken round-robin
across algorithms; the reported figure is ``num_blocks`` divided by the median pass time.
Absolute numbers depend on the machine; compare the ratios.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence

from kvpool.hashing.algorithms import (
    HASH_ALGORITHM_NAMES,
    VLLM_HASH_ALGORITHM_NAMES,
    available_hash_algorithms,
)
from kvpool.hashing.hasher import BlockHasher

BENCH_SEED_STRING = "kvpool-bench"
"""Explicit NONE_HASH seed, so the benchmark neither reads the environment nor warns."""

TOKEN_ID_LIMIT = 150_000
"""Token ids are drawn from ``[0, TOKEN_ID_LIMIT)``, the vocabulary size of large models."""


def run_hashing_bench(
    num_blocks: int = 20_000,
    repeat: int = 5,
    *,
    block_size: int = 16,
    algorithms: Sequence[str] | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Blocks hashed per second (median of ``repeat`` runs) for each algorithm.

    ``algorithms`` defaults to every installed one (xxhash names are left out without the
    xxhash package); naming an unavailable one raises as :class:`BlockHasher` would. ``seed``
    seeds the token generator. Keys keep :data:`HASH_ALGORITHM_NAMES` order.
    """
    if num_blocks <= 0 or repeat <= 0 or block_size <= 0:
        raise ValueError("num_blocks, repeat and block_size must be positive")
    names = available_hash_algorithms() if algorithms is None else tuple(algorithms)
    rng = random.Random(seed)
    token_ids = [rng.randrange(TOKEN_ID_LIMIT) for _ in range(num_blocks * block_size)]
    hashers = [BlockHasher(name, seed=BENCH_SEED_STRING) for name in sorted(names, key=_name_order)]
    for hasher in hashers:
        hasher.hash_blocks(None, token_ids, block_size)
    # Round-robin rather than one algorithm after another: a burst of load from another
    # process then slows one pass of every algorithm instead of every pass of one.
    timings: dict[str, list[float]] = {hasher.name: [] for hasher in hashers}
    for _ in range(repeat):
        for hasher in hashers:
            began = time.perf_counter()
            hasher.hash_blocks(None, token_ids, block_size)
            timings[hasher.name].append(time.perf_counter() - began)
    results = {name: num_blocks / statistics.median(runs) for name, runs in timings.items()}
    return results


def _name_order(name: str) -> int:
    try:
        return HASH_ALGORITHM_NAMES.index(name)
    except ValueError:
        return len(HASH_ALGORITHM_NAMES)


def format_hashing_bench(results: dict[str, float], baseline: str = "sha256") -> str:
    """A plain-text table of :func:`run_hashing_bench` results with ratios to ``baseline``."""
    base = results.get(baseline)
    lines = [f"{'algorithm':<12} {'vLLM-compatible':>15} {'blocks/s':>12} {'x ' + baseline:>10}"]
    for name, rate in results.items():
        compatible = "yes" if name in VLLM_HASH_ALGORITHM_NAMES else "no"
        ratio = f"{rate / base:.2f}" if base else "-"
        lines.append(f"{name:<12} {compatible:>15} {rate:>12,.0f} {ratio:>10}")
    return "\n".join(lines)


__all__ = ["BENCH_SEED_STRING", "format_hashing_bench", "run_hashing_bench"]
