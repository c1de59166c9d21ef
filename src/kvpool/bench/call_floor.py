"""What one call from Python into the fast pool costs, split into its parts.

A single-op verb of the fast backend (``get_cached_block`` of one hash, ``get_new_blocks(1)``,
``free_blocks([b])``, ``touch([b])``) is three costs in a row:

1. the **Python method**: argument checks, the lean-path tests, building the result;
2. the **entry** into compiled code: Numba's wrapper converts every argument (the pool's
   ``PoolArrays``, a ``bytes`` buffer, an int) and boxes the result;
3. the **kernel**'s own work: a hash probe, a queue unlink.

This module times them apart, on the CPU clock (``time.thread_time``), in interleaved rounds,
median per figure:

* ``empty``: a compiled function that does nothing, with the one-op kernel's exact signature,
  called the way the pool calls its kernel (``functools.partial`` over the pool's
  ``PoolArrays``). Nothing compiled can be called from Python for less: it is the floor of
  every single-op figure of a Numba backend;
* ``kernel``: the pool's bound one-op kernel (entry plus work);
* ``verb``: the public method (all three);
* ``python``: a plain Python function of the same arity that returns at once.

``verb - kernel`` is the Python method, ``kernel - empty`` the kernel's work. Put next to
vLLM's figure for the whole operation (``kvpool bench --vs-vllm``), these say how much of a
single-op ratio the call itself decides. ``benchmarks/call_floor.py`` prints them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from kvpool.backends import make_pool
from kvpool.bench.micro import BLOCK_SIZE, HashedRequest, random_hashes

FIGURES = ("lookup_hit", "lookup_miss", "alloc1_free1", "touch1_free1", "alloc64_free64")
"""Operations timed; each gets ``empty``, ``kernel``, ``verb`` and ``python`` rows where they
apply (a pair of calls counts as one operation). ``alloc64_free64`` is the array shape
(``free_blocks(get_new_blocks_array(64)[::-1])``), in ns per 64-block round trip: its
kernel row is the two batch kernels on ready arrays."""

_EMPTY: dict[str, Callable[..., int]] = {}


def _empty_entries() -> dict[str, Callable[..., int]]:
    """Compiled do-nothing functions with the signatures of ``h_lookup_one`` and
    ``h_pop``/``h_free_one``/``h_touch_one`` (compiled once per process)."""
    if not _EMPTY:
        import numba
        from numba import types as nt

        from kvpool.fast.compiled import POOL_ARRAYS as arrays
        hash_bytes = nt.Bytes(nt.uint8, 1, "C", readonly=True)

        def with_hash(s, block_hash, group):
            return 0

        def with_int(s, value):
            return 0

        _EMPTY["hash"] = numba.njit(with_hash).compile(nt.int64(arrays, hash_bytes, nt.int64))
        _EMPTY["int"] = numba.njit(with_int).compile(nt.int64(arrays, nt.int64))
    return _EMPTY


def _python_hash(block_hash: bytes, group: int) -> int:
    return 0


def _python_int(value: int) -> int:
    return 0


def _loops(pool: Any, hashes: list[bytes], cached: list[int], ops: int
           ) -> dict[str, Callable[[], None]]:
    """One timed loop per (figure, part), each doing ``ops`` operations."""
    st = pool._st
    st.lookup_one  # noqa: B018 - binds the one-op verbs (and their PoolArrays) now
    empty = _empty_entries()
    empty_hash = partial(empty["hash"], st.arrays)
    empty_int = partial(empty["int"], st.arrays)
    lookup, pop, free_one, touch_one = st.lookup_one, st.pop, st.free_one, st.touch_one
    get_cached, get_new, free, touch = (pool.get_cached_block, pool.get_new_blocks,
                                        pool.free_blocks, pool.touch)
    hit, miss = hashes[0], bytes(32)
    group = [0]
    block = [cached[0]]
    b = cached[0]
    r = range(ops)
    get_array = pool.get_new_blocks_array
    pop_into, free_ids = st.pop_unkeyed_into, st.free
    ids = np.empty(64, np.int64)
    reversed_ids = np.empty(64, np.int64)

    def kernels64() -> None:
        pop_into(ids, 64)
        reversed_ids[:] = ids[::-1]
        free_ids(reversed_ids)

    def repeat(body: Callable[[], Any]) -> Callable[[], None]:
        def loop() -> None:
            for _ in r:
                body()
        return loop

    return {
        "lookup_hit/empty": repeat(lambda: empty_hash(hit, 0)),
        "lookup_hit/kernel": repeat(lambda: lookup(hit, 0)),
        "lookup_hit/verb": repeat(lambda: get_cached(hit, group)),
        "lookup_hit/python": repeat(lambda: _python_hash(hit, 0)),
        "lookup_miss/kernel": repeat(lambda: lookup(miss, 0)),
        "lookup_miss/verb": repeat(lambda: get_cached(miss, group)),
        "alloc1_free1/empty": repeat(lambda: empty_int(empty_int(1))),
        "alloc1_free1/kernel": repeat(lambda: free_one(pop(1))),
        "alloc1_free1/verb": repeat(lambda: free(get_new(1))),
        "alloc1_free1/python": repeat(lambda: _python_int(_python_int(1))),
        "touch1_free1/kernel": repeat(lambda: (touch_one(b), free_one(b))),
        "touch1_free1/verb": repeat(lambda: (touch(block), free(block))),
        "alloc64_free64/kernel": repeat(kernels64),
        "alloc64_free64/verb": repeat(lambda: free(get_array(64)[::-1])),
    }


def run_call_floor(ops: int = 100_000, rounds: int = 7, num_blocks: int = 20_000,
                   seed: int = 0) -> dict[str, float]:
    """Nanoseconds per operation, ``"<figure>/<part>"`` → median over ``rounds``.

    The pool: ``num_blocks`` blocks, caching on, events off; 1,024 blocks keyed with random
    hashes and freed (so the hits are free cached blocks, as in a prefix hit), and the
    allocation loop pops unkeyed blocks from the queue's front.
    """
    pool = make_pool(num_blocks, backend="fast", hash_block_size=BLOCK_SIZE)
    hashes = random_hashes(np.random.default_rng(seed), 1024)
    blocks = pool.get_new_blocks(len(hashes))
    pool.cache_full_blocks(HashedRequest(hashes), blocks, 0, len(blocks), BLOCK_SIZE, 0)
    pool.free_blocks(blocks[::-1])  # cached and free: at the queue's tail
    loops = _loops(pool, hashes, blocks, ops)
    for loop in loops.values():  # warm-up: compile, bind, fill caches
        loop()
    samples: dict[str, list[float]] = {name: [] for name in loops}
    clock = time.thread_time
    for _ in range(rounds):
        for name, loop in loops.items():
            began = clock()
            loop()
            samples[name].append((clock() - began) / ops * 1e9)
    if pool.check_invariants():
        raise AssertionError("the pool broke an invariant during the call-floor loops")
    return {name: statistics.median(values) for name, values in samples.items()}


def format_call_floor(result: dict[str, float]) -> str:
    """One row per operation: ns for each part, and the split of the verb's time."""
    lines = [f"{'operation':<14} {'python':>8} {'empty':>8} {'kernel':>8} {'verb':>8}   "
             "verb = method + entry + work (ns)"]
    for figure in FIGURES:
        part = {p: result.get(f"{figure}/{p}") for p in ("python", "empty", "kernel", "verb")}
        cells = [f"{v:8.0f}" if v is not None else f"{'-':>8}" for v in part.values()]
        verb, kernel, empty = part["verb"], part["kernel"], part["empty"]
        split = ""
        if verb is not None and kernel is not None:
            split = f"{verb - kernel:.0f} method"
            if empty is not None:
                split += f" + {empty:.0f} entry + {kernel - empty:.0f} work"
            else:
                split += f" + {kernel:.0f} entry and work"
        lines.append(f"{figure:<14} {' '.join(cells)}   {split}")
    lines.append("CPU clock (time.thread_time), median of interleaved rounds; pairs "
                 "(alloc1_free1, touch1_free1, alloc64_free64) are two calls; alloc64_free64 "
                 "is ns per 64-block round trip.")
    return "\n".join(lines)


__all__ = ["FIGURES", "format_call_floor", "run_call_floor"]
