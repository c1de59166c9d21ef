"""Micro-benchmarks: one pool verb (or verb pair) at a time, in the scheduler's shapes.

Each benchmark builds a fresh pool of ``config.micro_num_blocks`` blocks (caching on, events
off), sets it up untimed, then times a loop of about ``config.micro_ops`` blocks or lookups
with ``perf_counter``. Figures (higher is better unless they end in ``_us``):

* ``alloc_free_K_blocks_per_s`` (K = 1, 16, 64, 256): ``free_blocks(get_new_blocks(K))`` in
  a loop; ``alloc_free_1_pair_us`` is the same loop at K = 1 as microseconds per pair;
* ``touch_64_blocks_per_s``: ``touch`` of 64 cached free blocks (the prefix-hit path: each
  leaves the LRU queue); only the touch is timed, the ``free_blocks`` that re-queues them is
  not;
* ``get_cached_block_hit_per_s`` / ``get_cached_block_miss_per_s``: single-group lookups of
  1024 cached hashes / 1024 absent ones;
* ``cache_full_blocks_64_blocks_per_s``: keying 64 freshly allocated blocks with fresh hashes
  in one call (allocation and release untimed);
* ``find_longest_cache_hit_64_blocks_per_s``: the longest-hit lookup over a 64-block chain
  that is fully cached (one method call where the pool offers it, see
  :mod:`kvpool.workload.verbs`).

Hashes are random 32-byte strings from a seeded generator: the pool never looks inside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from kvpool.backends import make_pool
from kvpool.bench.config import ALLOC_BATCHES, BenchConfig
from kvpool.workload.verbs import GROUP_IDS, longest_cache_hit_verb

BLOCK_SIZE = 16
LOOKUP_SET = 1024
"""Hashes per lookup benchmark: more than a cache line's worth, fewer than the pool."""


class HashedRequest:
    """The slice of a request ``cache_full_blocks`` reads with events off."""

    __slots__ = ("all_token_ids", "block_hashes")

    def __init__(self, block_hashes: list[bytes]) -> None:
        self.block_hashes = block_hashes
        self.all_token_ids: list[int] = []


def random_hashes(rng: np.random.Generator, count: int) -> list[bytes]:
    """``count`` distinct-with-overwhelming-probability 32-byte hashes."""
    raw = rng.bytes(32 * count)
    return [raw[i : i + 32] for i in range(0, 32 * count, 32)]


def _cached_blocks(pool: Any, hashes: list[bytes]) -> list[int]:
    """Allocate one block per hash and key them (they stay held)."""
    blocks = pool.get_new_blocks(len(hashes))
    pool.cache_full_blocks(HashedRequest(hashes), blocks, 0, len(blocks), BLOCK_SIZE, 0)
    return blocks


def bench_alloc_free(pool: Any, batch: int, ops: int) -> dict[str, float]:
    iterations = max(1, ops // batch)
    get_new_blocks, free_blocks = pool.get_new_blocks, pool.free_blocks
    began = time.perf_counter()
    for _ in range(iterations):
        free_blocks(get_new_blocks(batch))
    elapsed = time.perf_counter() - began
    figures = {f"alloc_free_{batch}_blocks_per_s": iterations * batch / elapsed}
    if batch == 1:
        figures["alloc_free_1_pair_us"] = elapsed / iterations * 1e6
    return figures


def bench_touch(pool: Any, ops: int, rng: np.random.Generator) -> dict[str, float]:
    blocks = _cached_blocks(pool, random_hashes(rng, 64))
    release = blocks[::-1]
    pool.free_blocks(release)  # now cached candidates at the tail of the queue
    touch, free_blocks, clock = pool.touch, pool.free_blocks, time.perf_counter
    iterations = max(1, ops // 64)
    elapsed = 0.0
    for _ in range(iterations):
        began = clock()
        touch(blocks)
        elapsed += clock() - began
        free_blocks(release)
    return {"touch_64_blocks_per_s": iterations * 64 / elapsed}


def bench_lookups(pool: Any, ops: int, rng: np.random.Generator) -> dict[str, float]:
    present = random_hashes(rng, LOOKUP_SET)
    absent = random_hashes(rng, LOOKUP_SET)
    _cached_blocks(pool, present)
    get_cached_block = pool.get_cached_block
    rounds = max(1, ops // LOOKUP_SET)
    figures = {}
    for name, hashes in (("hit", present), ("miss", absent)):
        began = time.perf_counter()
        for _ in range(rounds):
            for block_hash in hashes:
                get_cached_block(block_hash, GROUP_IDS)
        elapsed = time.perf_counter() - began
        figures[f"get_cached_block_{name}_per_s"] = rounds * LOOKUP_SET / elapsed
    return figures


def bench_cache_full_blocks(pool: Any, ops: int, rng: np.random.Generator) -> dict[str, float]:
    iterations = max(1, ops // 64)
    requests = [HashedRequest(random_hashes(rng, 64)) for _ in range(iterations)]
    get_new_blocks, free_blocks = pool.get_new_blocks, pool.free_blocks
    cache = pool.cache_full_blocks
    clock = time.perf_counter
    elapsed = 0.0
    for request in requests:
        blocks = get_new_blocks(64)
        began = clock()
        cache(request, blocks, 0, 64, BLOCK_SIZE, 0)
        elapsed += clock() - began
        free_blocks(blocks[::-1])
    return {"cache_full_blocks_64_blocks_per_s": iterations * 64 / elapsed}


def bench_longest_hit(pool: Any, ops: int, rng: np.random.Generator) -> dict[str, float]:
    hashes = random_hashes(rng, 64)
    _cached_blocks(pool, hashes)
    find = longest_cache_hit_verb(pool)
    if len(find(hashes, 64)) != 64:
        raise AssertionError("the cached chain must be a full hit")
    iterations = max(1, ops // 64)
    began = time.perf_counter()
    for _ in range(iterations):
        find(hashes, 64)
    elapsed = time.perf_counter() - began
    return {"find_longest_cache_hit_64_blocks_per_s": iterations * 64 / elapsed}


def _benchmarks(ops: int, seed: int) -> list[Callable[[Any], dict[str, float]]]:
    """Every micro-benchmark as ``pool -> figures`` (each gets its own seeded generator)."""
    def rng() -> np.random.Generator:
        return np.random.default_rng(seed)

    benches: list[Callable[[Any], dict[str, float]]] = [
        partial(bench_alloc_free, batch=k, ops=ops) for k in ALLOC_BATCHES
    ]
    benches += [
        lambda pool: bench_touch(pool, ops, rng()),
        lambda pool: bench_lookups(pool, ops, rng()),
        lambda pool: bench_cache_full_blocks(pool, ops, rng()),
        lambda pool: bench_longest_hit(pool, ops, rng()),
    ]
    return benches


def micro_once(backend: str, num_blocks: int, ops: int, seed: int) -> dict[str, float]:
    """One timed run of every micro-benchmark on fresh ``backend`` pools."""
    figures: dict[str, float] = {}
    for bench in _benchmarks(ops, seed):
        figures.update(bench(make_pool(num_blocks, backend=backend, hash_block_size=BLOCK_SIZE)))
    return figures


def warm_up_micro(backend: str) -> float:
    """Run every micro-benchmark once on a small pool (compiles JIT kernels); seconds."""
    began = time.perf_counter()
    micro_once(backend, 2 * LOOKUP_SET + 1, 256, 0)
    return time.perf_counter() - began


def run_micro(config: BenchConfig) -> dict[str, dict[str, list[float]]]:
    """Samples per backend and figure (``repeat`` each) plus one ``warmup_s`` sample.

    Repeats are the outer loop and backends the inner one, so slow drift of the machine
    affects every backend alike.
    """
    samples: dict[str, dict[str, list[float]]] = {
        backend: {"warmup_s": [warm_up_micro(backend)]} for backend in config.backends
    }
    for _ in range(config.repeat):
        for backend in config.backends:
            once = micro_once(backend, config.micro_num_blocks, config.micro_ops, config.seed)
            for name, value in once.items():
                samples[backend].setdefault(name, []).append(value)
    return samples


__all__ = ["BLOCK_SIZE", "HashedRequest", "micro_once", "random_hashes", "run_micro"]
