"""Kernel-level timing of the kit trace through the batch verbs (issue 8: ns per operation).

One documented command (any python with kvpool installed; no vLLM needed, only the kit's
``gen_trace.py``)::

    python benchmarks/bench_kernels.py --kit ../shared/vllm-kit --rounds 7 [--latency] [--json]

What it measures, per round (rounds interleave the two figures, medians are reported):

* ``pool_cpu_ms`` — the whole batch-verb replay (``kvpool simulate``'s driver, ``admit`` +
  ``step``, 20,000 blocks of 16 tokens, sha256 hashes), pool time on the thread's CPU clock
  (``report.pool_cpu_s``): kernels plus the Python of the verbs, as the vs-vLLM table counts it.
* ``kernel_ms`` — the kernels alone: every ``admit_request`` / ``run_step`` call of one
  recorded replay, called again in order on a fresh pool (same arguments, same growth), each
  timed on its own with ``perf_counter_ns``; ``kernel_best_ms`` sums, per call, its fastest
  round (a call preempted in one round is not preempted in all). Every replayed call must
  return what it returned when recorded (code, result, table): the figure is of the same work.
* ``ns_per_op`` — ``kernel_best_ms`` over the prefix-cache / queue operations of the trace:
  lookups probed (hit positions not answered by the admission memo, plus the miss that ends a
  scan), blocks popped, keys evicted, keys inserted.

``--latency`` first measures the machine's load-to-use latency with a pointer chase over a
random cycle (one dependent load at a time) per working-set size, and the same with 8
independent chases interleaved (what memory-level parallelism buys): the floor a dependent
chain of cache misses cannot beat.

Noise: on a shared 2-core machine, read the best-of figures and the medians, never one round.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from kvpool.backends import make_pool
from kvpool.bench import vllm_pattern
from kvpool.bench.vs_vllm import _as_trace_requests, load_kit_trace
from kvpool.fast import kernels as k
from kvpool.fast.state import FastState
from kvpool.hashing import BlockHasher
from kvpool.workload.driver import HASH_SEED, replay


def _replay_trace(requests: list) -> Any:
    gc.collect()
    pool = make_pool(vllm_pattern.NUM_BLOCKS, backend="fast",
                     hash_block_size=vllm_pattern.BLOCK)
    return replay(pool, requests, block_size=vllm_pattern.BLOCK,
                  max_running=vllm_pattern.MAX_RUNNING,
                  hasher=BlockHasher("sha256", seed=HASH_SEED))


class _Recorder:
    """Patches ``FastState._batch_kernels`` so that every batch-kernel call of one replay is
    kept: (verb, arguments copied before the call, code, result, table copied after)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, int, int, np.ndarray]] = []

    def __enter__(self) -> _Recorder:
        self._original = original = FastState._batch_kernels
        calls = self.calls

        def recording(st: FastState) -> tuple[Any, Any, Any]:
            if st._batch is not None and st._batch is st.__dict__.get("_recording"):
                return st._batch
            admit, step, cache = original(st)

            def rec_admit(*args: Any) -> int:
                saved = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
                code = admit(*args)
                n = args[4]  # num_blocks
                calls.append(("admit", saved, code, st.result(), st.out[:n].copy()))
                return code

            def rec_step(*args: Any) -> int:
                saved = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
                code = step(*args)
                n = int(args[0][1])
                calls.append(("step", saved, code, 0, st.out[:n].copy()))
                return code

            st._batch = st.__dict__["_recording"] = (rec_admit, rec_step, cache)
            return st._batch

        FastState._batch_kernels = recording  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        FastState._batch_kernels = self._original  # type: ignore[method-assign]


def _operations(calls: list, evictions: int) -> dict[str, int]:
    lookups = pops = inserts = 0
    for verb, args, code, result, _ in calls:
        if code not in (k.OK, k.REFUSED):
            continue
        if verb == "admit":
            memo, buf, lens, max_hit, num_blocks, num_full = args[:6]
            known = args[9]
            limit = min(max_hit, lens.shape[0])
            lookups += max(0, result - known) + (1 if result < limit else 0)
            if code == k.OK:
                pops += num_blocks - result
                inserts += max(0, num_full - result)
        else:
            plan, _, _, lens = args[:4]
            pops += int(plan[1])
            inserts += lens.shape[0]
    return {"lookups": lookups, "pops": pops, "evictions": evictions, "inserts": inserts,
            "total": lookups + pops + evictions + inserts}


def _kernel_round(calls: list, durations: np.ndarray) -> None:
    """Replay the recorded calls on a fresh pool; durations[i] = ns of call i (-1: skipped)."""
    gc.collect()
    st = FastState(vllm_pattern.NUM_BLOCKS, enable_caching=True, enable_events=False)
    admit, step, _ = st._batch_kernels()
    clock = time.perf_counter_ns
    for i, (verb, args, code, result, table) in enumerate(calls):
        if code == k.ERR_CAPACITY:  # grow as FastState.admit / .step do, untimed
            lens = args[2] if verb == "admit" else args[3]
            longest = int(lens.max()) if lens.shape[0] else 0
            pairs = max(0, args[5]) if verb == "admit" else lens.shape[0]
            st.reserve(pairs, longest)
            admit, step, _ = st._batch_kernels()
            durations[i] = -1
            continue
        fresh = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args[:1])
        full = fresh + args[1:]
        fn = admit if verb == "admit" else step
        began = clock()
        got = fn(*full)
        durations[i] = clock() - began
        if got != code or (verb == "admit" and st.result() != result) or not np.array_equal(
                st.out[: table.shape[0]], table):
            raise AssertionError(f"call {i} ({verb}) returned {got}, recorded {code}")


def _latency(sizes_kib: tuple[int, ...]) -> list[dict[str, float]]:
    import numba

    @numba.njit(cache=False)
    def chase(nxt, steps, start):
        i = start
        for _ in range(steps):
            i = nxt[i]
        return i

    @numba.njit(cache=False)
    def chase8(nxt, steps, s):
        a, b, c, d, e, f, g, h = s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]
        for _ in range(steps):
            a = nxt[a]
            b = nxt[b]
            c = nxt[c]
            d = nxt[d]
            e = nxt[e]
            f = nxt[f]
            g = nxt[g]
            h = nxt[h]
        return a + b + c + d + e + f + g + h

    rng = np.random.default_rng(0)
    rows = []
    for kib in sizes_kib:
        n = kib * 1024 // 64  # one int64 per 64-byte line: every load is a new line
        order = rng.permutation(n)
        nxt = np.zeros(n * 8, np.int64)
        nxt[order * 8] = np.roll(order, -1) * 8
        steps = 2_000_000
        chase(nxt, 1000, 0)
        starts = (order[:: max(1, n // 8)][:8] * 8).astype(np.int64)
        chase8(nxt, 10, starts)
        best1 = best8 = float("inf")
        for _ in range(5):
            t = time.perf_counter_ns()
            chase(nxt, steps, 0)
            best1 = min(best1, (time.perf_counter_ns() - t) / steps)
            t = time.perf_counter_ns()
            chase8(nxt, steps // 8, starts)
            best8 = min(best8, (time.perf_counter_ns() - t) / steps)
        rows.append({"kib": kib, "ns_per_dependent_load": best1, "ns_per_load_8_chains": best8})
    return rows


def _micro(rounds: int, batch: int = 100, hash_len: int = 32,
           n: int = vllm_pattern.NUM_BLOCKS) -> dict[str, float]:
    """Pure-kernel figures on a 20,000-block pool whose every block is cached (free, in
    random LRU order, 32-byte random hashes): ns per evicting pop (``get_new_blocks`` of
    ``batch`` blocks), per key insert (``cache_full_blocks`` of those blocks), per lookup hit
    (``lookup_blocks`` of ``batch`` cached keys); best of ``rounds`` x 50 batches."""
    rng = np.random.default_rng(0)
    st = FastState(n, enable_caching=True, enable_events=False)
    lens = np.full(batch, hash_len, np.int64)

    def fresh_hashes() -> np.ndarray:
        return rng.integers(0, 256, batch * hash_len, dtype=np.uint8)

    held = []
    for _ in range((n - 1) // batch):
        assert st.get_new_blocks(batch)[0] == k.OK
        cand = st.out[:batch].copy()
        assert st.cache_full(cand, None, fresh_hashes(), lens, 0, 1, 0, hash_len) == k.OK
        held.append(cand)
    order = np.concatenate(held)
    rng.shuffle(order)
    assert st.free(order) == k.OK
    clock = time.perf_counter_ns
    best = {"evicting_pop": float("inf"), "insert": float("inf"), "lookup_hit": float("inf")}
    groups = np.zeros(1, np.int64)
    found = np.zeros((1, batch), np.int64)
    for _ in range(rounds):
        pop = ins = look = 0
        for _ in range(50):
            t = clock()
            st.get_new_blocks(batch)
            pop += clock() - t
            cand = st.out[:batch].copy()
            buf = fresh_hashes()
            t = clock()
            st.cache_full(cand, None, buf, lens, 0, 1, 0, hash_len)
            ins += clock() - t
            t = clock()
            assert st.lookup(buf, lens, groups, found) == k.OK and st.result() == batch
            look += clock() - t
            st.free(cand[rng.permutation(batch)])
        for name, total in (("evicting_pop", pop), ("insert", ins), ("lookup_hit", look)):
            best[name] = min(best[name], total / (50 * batch))
    return {f"{name}_ns": value for name, value in best.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", default="../shared/vllm-kit")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--no-trace", action="store_true", help="kernel replay only")
    parser.add_argument("--micro", action="store_true",
                        help="also the pure-kernel evict / insert / lookup figures")
    parser.add_argument("--calls", help="recorded calls: load from this file if it exists, "
                        "else record and save there (A/B runs of two checkouts share them)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    if args.latency:
        out["latency"] = _latency((64, 1024, 4096, 16384, 65536, 262144))
        if not args.json:
            for row in out["latency"]:
                print(f"pointer chase {row['kib']:>7} KiB: {row['ns_per_dependent_load']:6.1f} ns "
                      f"per dependent load, {row['ns_per_load_8_chains']:5.1f} ns per load "
                      "with 8 chains")
    if args.micro:
        out["micro"] = _micro(args.rounds)
        if not args.json:
            print("pure kernels (ns per block, best of rounds): " + ", ".join(
                f"{name} {value:.1f}" for name, value in out["micro"].items()))
    requests = _as_trace_requests(load_kit_trace(args.kit))
    _replay_trace(requests[:40])  # compile (or load) the kernels
    if args.calls and Path(args.calls).exists():
        with open(args.calls, "rb") as f:
            decisions, calls = pickle.load(f)
    else:
        with _Recorder() as recorder:
            decisions = _replay_trace(requests).decisions()
        calls = recorder.calls
        if args.calls:
            with open(args.calls, "wb") as f:
                pickle.dump((decisions, calls), f)
    ops = _operations(calls, decisions["evictions"])
    durations = np.zeros((args.rounds, len(calls)), np.int64)
    pool_ms: list[float] = []
    for r in range(args.rounds):
        if not args.no_trace:
            pool_ms.append(_replay_trace(requests).pool_cpu_s * 1e3)
        _kernel_round(calls, durations[r])
    timed = durations[:, durations[0] >= 0]
    per_round = timed.sum(axis=1) / 1e6
    best = timed.min(axis=0).sum() / 1e6
    admits = np.array([c[0] == "admit" for c, d in zip(calls, durations[0], strict=True)
                       if d >= 0])
    out.update(
        decisions={name: decisions[name] for name in
                   ("blocks_allocated", "hit_tokens", "evictions", "steps")},
        operations=ops, calls=int(timed.shape[1]), rounds=args.rounds,
        pool_cpu_ms=statistics.median(pool_ms) if pool_ms else None,
        pool_cpu_ms_rounds=pool_ms,
        kernel_ms=statistics.median(per_round.tolist()), kernel_best_ms=best,
        admit_best_ms=timed[:, admits].min(axis=0).sum() / 1e6,
        step_best_ms=timed[:, ~admits].min(axis=0).sum() / 1e6,
        ns_per_op=best * 1e6 / ops["total"],
    )
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"decisions: {out['decisions']}")
    print(f"operations: {ops}")
    if pool_ms:
        print(f"pool CPU (batch-verb replay): median {out['pool_cpu_ms']:.1f} ms; rounds "
              + ", ".join(f"{v:.0f}" for v in pool_ms))
    print(f"kernels: median {out['kernel_ms']:.1f} ms, best-of per call {best:.1f} ms "
          f"(admit {out['admit_best_ms']:.1f}, step {out['step_best_ms']:.1f}) over "
          f"{out['calls']} calls; {out['ns_per_op']:.1f} ns per operation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
