"""Block copy and swap bandwidth against block size, CPU and CUDA, with the bound beside it.

    .venv/bin/python benchmarks/gpu_copy.py                  # CPU (and CUDA when present)
    .venv/bin/python benchmarks/gpu_copy.py --device cuda --json out.json

For each block size (bytes of one block of one layer's K, or V) it builds a one-layer paged
cache, draws random non-consecutive (src, dst) pairs — no two merge into a run, the worst
case for the copier — and times, as medians over ``--rounds`` interleaved rounds:

* ``copy``: :meth:`kvpool.gpu.BlockCopier.copy` end to end (validation, planning, launch) of
  the pairs as the manager hands them (a list of ``BlockCopy``), and ``copy arr`` of the
  same pairs as an int64 ``[n, 3]`` array (no conversion);
* ``plan``: the planning alone (checks, merging, segments; µs per batch), list and array;
* ``kernel``: the launch alone over the planned segments; on the CPU also ``1 lane``, the
  same kernel copying one segment at a time (what interleaving buys);
* ``swap out`` / ``swap in``: the same blocks between the cache and a host mirror (pinned on
  CUDA) through the same kernel;
* the **bound**: on the CPU ``np.copyto`` of one contiguous buffer of the same total bytes
  (and torch's ``index_copy_`` of the same blocks, the obvious alternative); on CUDA a plain
  device-to-device ``copy_`` of the same bytes, and pinned host↔device ``copy_`` for swaps.

CPU rows give wall-clock GB/s (and the CPU clock, ``time.thread_time``, beside it: on a busy
machine wall time includes waiting for a core). Targets (issue 11): CPU copy ≥ 80% of
``np.copyto`` for blocks ≥ 32 KiB; CUDA copy ≥ 85% of device-to-device and swap ≥ 80% of
pinned bandwidth. On a GPU machine the whole run takes well under five minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

from kvpool.gpu import BlockCopier, PagedKVCache
from kvpool.gpu import copy_plan as plan
from kvpool.gpu.copier import launch_segments
from kvpool.gpu.cpu_kernels import copy_segments
from kvpool.policy import BlockCopy, FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

SIZES_KIB = (4, 16, 32, 64, 128, 256, 1024)


def geometry(block_bytes: int, total_bytes: int) -> tuple[KVCacheConfig, int]:
    """A one-group config whose blocks (K or V, one layer) are ``block_bytes`` of fp16."""
    block_size = 16
    head_size = block_bytes // (2 * block_size)
    num_blocks = max(8, total_bytes // (2 * block_bytes))
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=head_size)
    return KVCacheConfig(num_blocks, (KVCacheGroupSpec(spec),)), num_blocks


def random_pairs(num_blocks: int, rng: np.random.Generator) -> list[BlockCopy]:
    """Half the blocks onto the other half, shuffled so that no two pairs form a run; as the
    manager hands them over (``take_kv_cache_block_copies``)."""
    ids = rng.permutation(np.arange(1, num_blocks))
    half = len(ids) // 2
    src, dst = ids[:half], ids[half:2 * half]
    return [BlockCopy(int(s), int(d), 0) for s, d in zip(src, dst, strict=True)]


class Timer:
    """Wall (and CPU) seconds of a callable; CUDA work timed with events."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> tuple[float, float]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.thread_time()
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3, time.thread_time() - t0
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()
        return time.perf_counter() - w0, time.thread_time() - c0


def measure(device: torch.device, block_kib: int, total_mib: int, rounds: int,
            rng: np.random.Generator) -> dict:
    block_bytes = block_kib * 1024
    config, num_blocks = geometry(block_bytes, total_mib * 2**20)
    cache = PagedKVCache(config, torch.float16, device, num_layers=1)
    cache.flat.normal_()
    pairs = random_pairs(num_blocks, rng)
    copier = BlockCopier(cache)
    arr = plan.as_pair_array(pairs)
    seg = copier.planner.plan(arr).segments
    moved = int(seg[:, 2].sum()) * cache.word_bytes
    host = PagedKVCache(config, torch.float16, "cpu", num_layers=1, num_blocks=len(pairs) + 1,
                        pin_memory=device.type == "cuda")
    out_pairs = [(s, i, 0) for i, (s, _, _) in enumerate(pairs)]
    out_seg = plan.CopyPlanner(cache, host, same_space=False, null_dst=False).plan(
        out_pairs).segments
    in_pairs = [(i, d, 0) for i, (_, d, _) in enumerate(pairs)]
    in_seg = plan.CopyPlanner(host, cache, same_space=False).plan(in_pairs).segments
    # Bounds: contiguous buffers of the same size.
    a = torch.empty(moved, dtype=torch.uint8, device=device).random_()
    b = torch.empty_like(a)
    timer = Timer(device)
    cases = {
        "copy": lambda: copier.copy(pairs),
        "copy_array": lambda: copier.copy(arr),
        "plan": lambda: copier.planner.plan(pairs),
        "plan_array": lambda: copier.planner.plan(arr),
        "kernel": lambda: launch_segments(cache, cache, seg),
        "swap_out": lambda: launch_segments(cache, host, out_seg),
        "swap_in": lambda: launch_segments(host, cache, in_seg),
    }
    if device.type == "cpu":
        words = cache.words().numpy()
        cases["kernel_1lane"] = lambda: copy_segments(words, words, seg, cache.word_bytes, 1, 64)
        an, bn = a.numpy(), b.numpy()
        cases["np.copyto"] = lambda: np.copyto(bn, an)
        view = cache.layer(0, 0)[0]
        src_idx = torch.tensor([p[0] for p in pairs])
        dst_idx = torch.tensor([p[1] for p in pairs])
        cases["index_copy_"] = lambda: view.index_copy_(0, dst_idx, view.index_select(0, src_idx))
    else:
        pinned = torch.empty(moved, dtype=torch.uint8, pin_memory=True)
        cases["d2d copy_"] = lambda: b.copy_(a)
        cases["pinned h2d"] = lambda: a.copy_(pinned, non_blocking=True)
        cases["pinned d2h"] = lambda: pinned.copy_(a, non_blocking=True)
    for fn in cases.values():  # warm-up: compile, fault pages in
        fn()
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):  # interleaved: every case in every round
        for name, fn in cases.items():
            w, c = timer(fn)
            wall[name].append(w)
            cpu[name].append(c)
    copier.end_step()
    # index_copy_ moves half the bytes per call (K only); scale to the same byte count.
    scale = {"index_copy_": 0.5}
    row = {"device": device.type, "block_kib": block_kib, "pairs": len(pairs),
           "bytes": moved}
    for name in ("plan", "plan_array"):  # µs per batch, not GB/s
        row[name + "_us"] = statistics.median(wall.pop(name)) * 1e6
        row[name + "_cpu_us"] = statistics.median(cpu.pop(name)) * 1e6
    for name in wall:
        row[name] = moved * scale.get(name, 1.0) / statistics.median(wall[name]) / 1e9
        row[name + "_cpu"] = moved * scale.get(name, 1.0) / max(
            statistics.median(cpu[name]), 1e-9) / 1e9
    return row


def print_table(rows: list[dict]) -> None:
    for device in sorted({r["device"] for r in rows}):
        sub = [r for r in rows if r["device"] == device]
        if device == "cpu":
            print("\nCPU, wall clock (GB/s; % of np.copyto of the same bytes in one call; "
                  "copy = BlockCopier.copy of a BlockCopy list, arr = of an int64 array; "
                  "plan = planning alone, µs per batch, list / array)")
            print(f"{'block':>8} {'pairs':>6} {'copy':>6} {'%':>4} {'arr':>6} {'%':>4} "
                  f"{'kernel':>6} {'%':>4} {'1 lane':>6} {'%':>4} {'plan µs':>11} "
                  f"{'swap out':>8} {'swap in':>7} {'copyto':>6} {'idx_copy_':>9}")
            for r in sub:
                bound = r["np.copyto"]
                print(f"{r['block_kib']:>6}Ki {r['pairs']:>6} "
                      f"{r['copy']:>6.2f} {100 * r['copy'] / bound:>3.0f}% "
                      f"{r['copy_array']:>6.2f} {100 * r['copy_array'] / bound:>3.0f}% "
                      f"{r['kernel']:>6.2f} {100 * r['kernel'] / bound:>3.0f}% "
                      f"{r['kernel_1lane']:>6.2f} {100 * r['kernel_1lane'] / bound:>3.0f}% "
                      f"{r['plan_us']:>5.0f}/{r['plan_array_us']:<5.0f} "
                      f"{r['swap_out']:>8.2f} {r['swap_in']:>7.2f} {bound:>6.2f} "
                      f"{r['index_copy_']:>9.2f}")
            print("\nCPU, CPU clock (time.thread_time; the same columns)")
            print(f"{'block':>8} {'copy':>6} {'%':>4} {'arr':>6} {'%':>4} {'kernel':>6} "
                  f"{'%':>4} {'plan µs':>11} {'copyto':>6}")
            for r in sub:
                bound = r["np.copyto_cpu"]
                print(f"{r['block_kib']:>6}Ki {r['copy_cpu']:>6.2f} "
                      f"{100 * r['copy_cpu'] / bound:>3.0f}% {r['copy_array_cpu']:>6.2f} "
                      f"{100 * r['copy_array_cpu'] / bound:>3.0f}% {r['kernel_cpu']:>6.2f} "
                      f"{100 * r['kernel_cpu'] / bound:>3.0f}% "
                      f"{r['plan_cpu_us']:>5.0f}/{r['plan_array_cpu_us']:<5.0f} "
                      f"{bound:>6.2f}")
        else:
            print(f"\n{device.upper()} (GB/s; copy vs device-to-device copy_, swap vs pinned; "
                  "plan: µs per batch on the host, list / array)")
            print(f"{'block':>8} {'pairs':>6} {'copy':>7} {'arr':>7} {'kernel':>7} {'% d2d':>6} "
                  f"{'plan µs':>11} {'swap out':>8} {'% d2h':>6} {'swap in':>8} {'% h2d':>6} "
                  f"{'d2d':>7} {'d2h':>7} {'h2d':>7}")
            for r in sub:
                print(f"{r['block_kib']:>6}Ki {r['pairs']:>6} {r['copy']:>7.1f} "
                      f"{r['copy_array']:>7.1f} "
                      f"{r['kernel']:>7.1f} {100 * r['kernel'] / r['d2d copy_']:>5.0f}% "
                      f"{r['plan_us']:>5.0f}/{r['plan_array_us']:<5.0f} "
                      f"{r['swap_out']:>8.1f} {100 * r['swap_out'] / r['pinned d2h']:>5.0f}% "
                      f"{r['swap_in']:>8.1f} {100 * r['swap_in'] / r['pinned h2d']:>5.0f}% "
                      f"{r['d2d copy_']:>7.1f} {r['pinned d2h']:>7.1f} "
                      f"{r['pinned h2d']:>7.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                        help="all = CPU, plus CUDA when available (default)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES_KIB)),
                        help="block sizes in KiB, comma-separated")
    parser.add_argument("--total-mib", type=int, default=0,
                        help="cache size per block size (default: 256 CPU, 2048 CUDA)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the copy kernel is single-threaded; so is the bound
    devices = []
    if args.device in ("cpu", "all"):
        devices.append(torch.device("cpu"))
    if args.device == "cuda" or (args.device == "all" and torch.cuda.is_available()):
        devices.append(torch.device("cuda"))
    rng = np.random.default_rng(0)
    rows = []
    for device in devices:
        total = args.total_mib or (2048 if device.type == "cuda" else 256)
        for kib in (int(s) for s in args.sizes.split(",")):
            rows.append(measure(device, kib, total, args.rounds, rng))
            print(f"measured {device.type} {kib} KiB", file=sys.stderr)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
