"""kvpool against the real vLLM, same workload, same run: ``kvpool bench --vs-vllm PYTHON``.

The vLLM side is the kit's own ``bench.py`` (``vllm-kit/``: it defines the workload and drives
``vllm.v1.core.block_pool.BlockPool``), run by :mod:`kvpool.bench.vllm_side` in one
long-lived process of the vLLM venv's python. The kvpool side replays the very same trace
(the kit's ``gen_trace.make_trace()``, imported from the kit) in this process, in three API
shapes per backend:

* **vLLM pattern** — :func:`kvpool.bench.vllm_pattern.replay_vllm_pattern`: the kit's loop,
  call for call (one ``get_cached_block`` per lookup, one call per block batch);
* **batch verbs** — :func:`kvpool.workload.driver.replay` (``kvpool simulate``): one
  ``admit_into`` per admission attempt, one ``step`` per scheduler step, same decisions;
* **batch verbs, raw hashing** — the same with ``raw_hash`` (default ``kvhash_raw``: one
  native call per prompt, not vLLM-compatible), for the wall time including hashing.

plus the kit's micro loops (:func:`kvpool.bench.vllm_pattern.run_micro`). **Method.** Rounds
interleave the two sides (vLLM, then every kvpool backend and shape, per round and clock), so
drift of a shared machine hits both alike; every figure is the median over ``--rounds``.
Each figure is measured twice: on the wall clock (``perf_counter``) and on the thread's CPU
clock (``thread_time``; the vLLM side swaps the kit's timer for it). CPU time is the figure to
trust on a busy machine. Ratios are "times better than vLLM": ``vLLM / kvpool`` for times,
``kvpool / vLLM`` for rates. The deterministic figures (blocks allocated, hit tokens,
evictions, steps, ...) must be equal on every side; a difference is an error (exit 1).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.backends import make_pool
from kvpool.bench import vllm_pattern
from kvpool.bench.construct import measure_construction
from kvpool.bench.json_process import JsonLineProcess
from kvpool.errors import InvalidConfig
from kvpool.hashing import BlockHasher
from kvpool.workload.driver import HASH_SEED, replay
from kvpool.workload.trace import TraceRequest

CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}
DECISIONS = ("requests", "steps", "blocks_allocated", "prompt_tokens", "hit_tokens",
             "evictions")
"""Decision figures every side must report identically."""
PATTERN_DECISIONS = (*DECISIONS, "cache_lookups", "blocks_cached")
"""... and those the vLLM-pattern replay must also share with vLLM."""


class VllmDivergence(Exception):
    """A kvpool side made a decision other than vLLM's on the same trace."""


@dataclass(frozen=True)
class VsVllmConfig:
    """``python``: the vLLM venv's interpreter; ``kit``: the kit directory."""

    python: str
    kit: str
    backends: tuple[str, ...] = ("fast", "reference")
    rounds: int = 3
    raw_hash: str = "kvhash_raw"
    micro: bool = True
    micro_slices: int = 5
    """Micro loops per round and clock: that many short runs (``MICRO_ITERS / slices``
    iterations each) alternating between the sides, so drift of the machine within a round
    hits both alike (a single 200k-iteration run per side disagreed with itself by up to
    1.7x between the two clocks: see benchmarks/README.md)."""
    construct: bool = True


def default_kit() -> str | None:
    """``$KVPOOL_VLLM_KIT``, else ``../shared/vllm-kit`` from the working directory if it
    has a ``bench.py``."""
    kit = os.environ.get("KVPOOL_VLLM_KIT")
    if kit:
        return kit
    guess = Path("..") / "shared" / "vllm-kit"
    return str(guess.resolve()) if (guess / "bench.py").exists() else None


class VllmSide(JsonLineProcess):
    """The kit's ``bench.py`` in the vLLM venv, one process, one JSON line per command."""

    name = "the vLLM side"

    def __init__(self, python: str, kit: str) -> None:
        env = dict(os.environ, PYTHONHASHSEED="0", VLLM_LOGGING_LEVEL="WARNING",
                   VLLM_LOGGING_STREAM="ext://sys.stderr")
        env.pop("PYTHONPATH", None)  # the vLLM venv's own packages only
        script = str(Path(__file__).with_name("vllm_side.py"))
        super().__init__([python, script, kit], env)
        self.meta = self.ask({"what": "meta"})


def load_kit_trace(kit: str) -> list[tuple[str, int, list[int], list[int]]]:
    """The kit's built-in trace, as its ``bench.py`` holds it (``gen_trace`` is stdlib only)."""
    spec = importlib.util.spec_from_file_location("kit_gen_trace", Path(kit) / "gen_trace.py")
    if spec is None or spec.loader is None:
        raise InvalidConfig(f"no gen_trace.py in the vLLM kit {kit!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trace, _ = module.make_trace()
    return [(str(i), 0, prompt, outputs) for i, (prompt, outputs) in enumerate(trace)]


def _as_trace_requests(trace: list[tuple[str, int, list[int], list[int]]]) -> list[TraceRequest]:
    return [TraceRequest(rid, arrival, tuple(prompt), len(outputs))
            for rid, arrival, prompt, outputs in trace]


def _batch_replay(backend: str, trace: list[TraceRequest], algorithm: str,
                  clock: Callable[[], float]) -> dict[str, Any]:
    gc.collect()  # an earlier run's garbage is not collected inside this one (both sides)
    pool = make_pool(vllm_pattern.NUM_BLOCKS, backend=backend,
                     hash_block_size=vllm_pattern.BLOCK)
    hasher = BlockHasher(algorithm, seed=HASH_SEED)
    began = clock()
    report = replay(pool, trace, block_size=vllm_pattern.BLOCK,
                    max_running=vllm_pattern.MAX_RUNNING, hasher=hasher)
    total = clock() - began
    out = report.decisions()
    cpu = clock is time.thread_time
    out.update(wall_s=total, pool_s=report.pool_cpu_s if cpu else report.pool_s,
               hash_s=report.hash_cpu_s if cpu else report.hash_s)
    return out


def _pattern_replay(backend: str, trace: list[tuple[str, int, list[int], list[int]]],
                    clock: Callable[[], float]) -> dict[str, Any]:
    gc.collect()
    pool = make_pool(vllm_pattern.NUM_BLOCKS, backend=backend,
                     hash_block_size=vllm_pattern.BLOCK)
    hasher = BlockHasher("sha256", seed=HASH_SEED)
    return vllm_pattern.replay_vllm_pattern(pool, trace, hasher, clock)


@dataclass
class _Samples:
    """Every measured value by (side, figure, clock), in round order."""

    values: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)

    def add(self, side: str, clock: str, figures: dict[str, Any], names: tuple[str, ...]
            ) -> None:
        for name in names:
            if figures.get(name) is not None:
                self.values.setdefault((side, name, clock), []).append(float(figures[name]))

    def median(self, side: str, name: str, clock: str) -> float | None:
        values = self.values.get((side, name, clock))
        return statistics.median(values) if values else None


TRACE_TIMES = ("pool_s", "wall_s", "hash_s")
CONSTRUCT_N = 1_000_000
CONSTRUCT_FIGURES = ("construct_1M_s", "construct_1M_bytes_per_block")
CONSTRUCT_CLOCK = "fresh"
"""Construction is timed by each side in fresh processes (the kit's ``bench_construct``,
kvpool's :func:`~kvpool.bench.construct.measure_construction`), wall clock."""


def _vllm_construct(answer: dict[str, Any]) -> dict[str, float]:
    """The kit's 1M-block construction row as this module's figures: seconds, and bytes per
    block as the larger of RSS growth and the tracemalloc peak (kvpool's rule too)."""
    row = answer[str(CONSTRUCT_N)]
    grown = max(row["rss_growth_mib"], row["tracemalloc_peak_mib"]) * 2**20
    return {"construct_1M_s": row["seconds"], "construct_1M_bytes_per_block": grown / CONSTRUCT_N}


def _kvpool_construct(backend: str) -> dict[str, float]:
    m = measure_construction(backend, CONSTRUCT_N, 3)
    grown = max(max(m["rss_bytes"], 0), m["traced_bytes"])
    return {"construct_1M_s": m["seconds"], "construct_1M_bytes_per_block": grown / CONSTRUCT_N}

MICRO_RATES = ("alloc1_free1_pairs_per_s", "alloc64_free64_blocks_per_s",
               "alloc64_free64_array_blocks_per_s", "hash_block_tokens_sha256_per_s",
               "hash_prompt_sha256_blocks_per_s", "hash_prompt_kvhash_raw_blocks_per_s",
               "get_cached_block_hit_per_s", "get_cached_block_miss_per_s",
               "touch1_free1_pairs_per_s", "alloc1_evicting_per_s")


def _check_decisions(expected: dict[str, Any], got: dict[str, Any], names: tuple[str, ...],
                     side: str) -> None:
    diff = {n: (expected.get(n), got.get(n)) for n in names if expected.get(n) != got.get(n)}
    if diff:
        raise VllmDivergence(f"{side} decided differently from vLLM: "
                             + ", ".join(f"{n} vLLM {a} vs {b}" for n, (a, b) in diff.items()))


def _warm_up(config: VsVllmConfig, trace: list, requests: list[TraceRequest]) -> None:
    """Compile (fast) and touch every code path once on a slice of the trace."""
    for backend in config.backends:
        _pattern_replay(backend, trace[:40], time.perf_counter)
        for algorithm in ("sha256", config.raw_hash):
            _batch_replay(backend, requests[:40], algorithm, time.perf_counter)
        if config.micro:
            vllm_pattern.run_micro(backend, BlockHasher("sha256", seed=HASH_SEED),
                                   n_blocks=2_000, iters=2_000)


MICRO_ITERS = 200_000
"""Iterations of each micro loop per round and clock (the kit's ``run_micro`` default)."""


def _micro_slices(config: VsVllmConfig, vllm: VllmSide, samples: _Samples, clock_name: str,
                  clock: Callable[[], float]) -> None:
    """The micro loops of both sides in ``config.micro_slices`` short alternating runs, the
    side that starts alternating too; every run is one sample of each rate."""
    iters = max(1, MICRO_ITERS // config.micro_slices)
    hasher = BlockHasher("sha256", seed=HASH_SEED)

    def vllm_run() -> None:
        samples.add("vllm", clock_name,
                    vllm.ask({"what": "micro", "clock": clock_name, "iters": iters}),
                    MICRO_RATES)

    def kvpool_run() -> None:
        for backend in config.backends:
            gc.collect()
            samples.add(f"{backend}/pattern", clock_name,
                        vllm_pattern.run_micro(backend, hasher, clock, iters=iters), MICRO_RATES)

    for i in range(config.micro_slices):
        for run in ((vllm_run, kvpool_run) if i % 2 == 0 else (kvpool_run, vllm_run)):
            run()


def run_vs_vllm(config: VsVllmConfig, log: Callable[[str], None] = lambda _: None
                ) -> dict[str, Any]:
    """Interleaved rounds of both sides (see the module docstring); the medians, as
    ``{"rows": [...], "meta": {...}}`` (rows: :func:`table_rows`). Raises
    :class:`VllmDivergence` if a kvpool side decides differently from vLLM."""
    if config.rounds < 1:
        raise InvalidConfig(f"rounds must be >= 1, got {config.rounds}")
    if config.micro_slices < 1:
        raise InvalidConfig(f"micro_slices must be >= 1, got {config.micro_slices}")
    trace = load_kit_trace(config.kit)
    requests = _as_trace_requests(trace)
    log(f"warming up kvpool ({', '.join(config.backends)}) and starting vLLM")
    _warm_up(config, trace, requests)
    vllm = VllmSide(config.python, config.kit)
    samples = _Samples()
    try:
        for r in range(config.rounds):
            for clock_name, clock in CLOCKS.items():
                log(f"round {r + 1}/{config.rounds} {clock_name}: vLLM trace")
                ref = vllm.ask({"what": "trace", "clock": clock_name})
                samples.add("vllm", clock_name, ref, TRACE_TIMES)
                for backend in config.backends:
                    log(f"round {r + 1}/{config.rounds} {clock_name}: kvpool {backend} trace")
                    got = _pattern_replay(backend, trace, clock)
                    _check_decisions(ref, got, PATTERN_DECISIONS, f"{backend} vLLM pattern")
                    samples.add(f"{backend}/pattern", clock_name, got, TRACE_TIMES)
                    for shape, algorithm in (("batch", "sha256"), ("raw", config.raw_hash)):
                        got = _batch_replay(backend, requests, algorithm, clock)
                        _check_decisions(ref, got, DECISIONS, f"{backend} batch verbs")
                        samples.add(f"{backend}/{shape}", clock_name, got, TRACE_TIMES)
                if config.micro:
                    log(f"round {r + 1}/{config.rounds} {clock_name}: micro")
                    _micro_slices(config, vllm, samples, clock_name, clock)
            if config.construct:
                log(f"round {r + 1}/{config.rounds}: construct 1M (fresh processes)")
                samples.add("vllm", CONSTRUCT_CLOCK,
                            _vllm_construct(vllm.ask({"what": "construct"})), CONSTRUCT_FIGURES)
                for backend in config.backends:
                    samples.add(f"{backend}/pattern", CONSTRUCT_CLOCK, _kvpool_construct(backend),
                                CONSTRUCT_FIGURES)
    finally:
        vllm.close()
    meta = {"vllm": vllm.meta, "rounds": config.rounds, "backends": list(config.backends),
            "raw_hash": config.raw_hash, "python": sys.version.split()[0],
            "kit": str(Path(config.kit).resolve())}
    return {"rows": table_rows(samples, config), "meta": meta}


TARGETS: dict[str, float] = {
    "trace pool s, vLLM call pattern [fast]": 2.0,
    "trace pool s, batch verbs [fast]": 20.0,
    "trace wall s incl. hashing, batch verbs kvhash_raw [fast]": 5.0,
    "micro alloc1_free1_pairs_per_s": 2.0,
    "micro alloc64_free64_blocks_per_s": 5.0,
    "micro alloc64_free64_array_blocks_per_s": 30.0,
    "micro hash_block_tokens_sha256_per_s": 1.0,
    "micro get_cached_block_hit_per_s": 1.0,
    "micro get_cached_block_miss_per_s": 1.0,
    "micro touch1_free1_pairs_per_s": 1.0,
    "micro alloc1_evicting_per_s": 1.0,
    "construct 1M blocks s": 200.0,
}
"""Issue 8's targets: the fast backend's ratio to vLLM on the CPU clock, per row
(construction: in fresh processes, wall clock)."""
LIMITS: dict[str, float] = {"construct 1M blocks, bytes per block": 48.0}
"""Issue 8's absolute bounds on the fast backend's own figure, per row."""


def _row(samples: _Samples, label: str, vllm_name: str, sides: dict[str, tuple[str, str]],
         clock: str, rate: bool) -> dict[str, Any]:
    ref = samples.median("vllm", vllm_name, clock)
    row: dict[str, Any] = {"figure": label, "clock": clock, "vllm": ref, "kvpool": {},
                           "ratio": {}}
    goal = TARGETS.get(label) if clock in ("cpu", CONSTRUCT_CLOCK) else None
    if goal is not None:
        row["target"] = goal
    limit = LIMITS.get(label)
    if limit is not None:
        row["limit"] = limit
    for column, (side, name) in sides.items():
        value = samples.median(side, name, clock)
        if value is None:
            continue
        row["kvpool"][column] = value
        if ref and value:
            row["ratio"][column] = value / ref if rate else ref / value
    if goal is not None and "fast" in row["ratio"]:
        row["met"] = row["ratio"]["fast"] >= goal
    if limit is not None and "fast" in row["kvpool"]:
        row["met"] = row["kvpool"]["fast"] <= limit
    return row


def table_rows(samples: _Samples, config: VsVllmConfig) -> list[dict[str, Any]]:
    """One row per (figure, clock): vLLM's median, each kvpool column's, the ratios."""
    rows = []
    for clock in ("cpu", "wall"):
        for backend in config.backends:
            rows.append(_row(samples, f"trace pool s, vLLM call pattern [{backend}]", "pool_s",
                             {backend: (f"{backend}/pattern", "pool_s")}, clock, False))
            rows.append(_row(samples, f"trace pool s, batch verbs [{backend}]", "pool_s",
                             {backend: (f"{backend}/batch", "pool_s")}, clock, False))
            rows.append(_row(samples, f"trace wall s incl. hashing, batch verbs sha256 "
                             f"[{backend}]", "wall_s",
                             {backend: (f"{backend}/batch", "wall_s")}, clock, False))
            rows.append(_row(samples, f"trace wall s incl. hashing, batch verbs "
                             f"{config.raw_hash} [{backend}]", "wall_s",
                             {backend: (f"{backend}/raw", "wall_s")}, clock, False))
        rows.append(_row(samples, "trace hash s, sha256 (vLLM-compatible)", "hash_s",
                         {b: (f"{b}/batch", "hash_s") for b in config.backends[:1]}, clock,
                         False))
        rows.append(_row(samples, f"trace hash s, {config.raw_hash} (not vLLM-compatible)",
                         "hash_s", {b: (f"{b}/raw", "hash_s") for b in config.backends[:1]},
                         clock, False))
        if config.micro:
            for name in MICRO_RATES:
                vllm_name = ("hash_block_tokens_sha256_per_s" if name.startswith("hash_")
                             else name.replace("_array", ""))
                rows.append(_row(samples, f"micro {name}", vllm_name,
                                 {b: (f"{b}/pattern", name) for b in config.backends}, clock,
                                 True))
    if config.construct:
        for label, name in (("construct 1M blocks s", "construct_1M_s"),
                            ("construct 1M blocks, bytes per block",
                             "construct_1M_bytes_per_block")):
            rows.append(_row(samples, label, name,
                             {b: (f"{b}/pattern", name) for b in config.backends},
                             CONSTRUCT_CLOCK, False))
    return rows


def row_cells(row: dict[str, Any], backends: Sequence[str]) -> list[str]:
    """One row as text, for every renderer (this module's plain table, the CLI's rich one):
    figure, clock, vLLM, then value and ratio per backend, then the target's verdict
    (empty when the figure has none)."""
    cells = [row["figure"], row["clock"], _fmt(row["vllm"])]
    for c in backends:
        value, ratio = row["kvpool"].get(c), row["ratio"].get(c)
        cells += [_fmt(value), f"{ratio:.2f}x" if ratio else "-"]
    verdicts: dict[Any, str] = {True: "met", False: "MISSED"}
    verdict = verdicts.get(row.get("met"), "-")
    if "target" in row:
        cells.append(f">= {row['target']:g}x {verdict}")
    elif "limit" in row:
        cells.append(f"<= {row['limit']:g} {verdict}")
    else:
        cells.append("")
    return cells


def footer(result: dict[str, Any]) -> str:
    """The line under the table: versions, rounds, how to read a ratio."""
    meta = result["meta"]
    return (f"vLLM {meta['vllm'].get('vllm')} (python {meta['vllm'].get('python')}), "
            f"kvpool python {meta['python']}; medians of {meta['rounds']} interleaved "
            "rounds; ratio = times better than vLLM; deterministic figures equal; "
            f"clock {CONSTRUCT_CLOCK}: wall time in fresh processes")


def format_table(result: dict[str, Any]) -> str:
    """The rows as one fixed-width table (CPU rows first)."""
    columns = result["meta"]["backends"]
    head = f"{'figure':<62} {'clock':<5} {'vLLM':>12}"
    for c in columns:
        head += f" {c:>12} {'ratio':>7}"
    head += "  target (fast, cpu)"
    lines = [head, "-" * len(head)]
    for row in result["rows"]:
        cells = row_cells(row, columns)
        line = f"{cells[0]:<62} {cells[1]:<5} {cells[2]:>12}"
        for i in range(len(columns)):
            line += f" {cells[3 + 2 * i]:>12} {cells[4 + 2 * i]:>7}"
        if cells[-1]:
            line += f"  {cells[-1]}"
        lines.append(line)
    lines.append(footer(result))
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4f}"


__all__ = ["VllmDivergence", "VsVllmConfig", "default_kit", "footer", "format_table", "row_cells",
           "run_vs_vllm"]
