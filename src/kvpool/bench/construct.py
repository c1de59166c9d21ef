"""Construction cost: seconds to build an N-block pool and bytes it takes per block.

Method. Each (backend, N) is measured in a **fresh Python subprocess**, so that nothing the
parent allocated (other backends, earlier pools, freed arenas) hides or inflates growth:

1. import the backend and build a small pool once (warm-up: imports and JIT compilation),
   reported as ``warmup_s``;
2. memory, two ways, because each misses something:

   * **RSS**: reset the peak-RSS mark (``echo 5 > /proc/self/clear_refs``), build the pool,
     then ``VmHWM - VmRSS before``. It sees every byte the process really touched, Python
     objects and C buffers alike, but not pages allocated and never written (``np.zeros``
     is backed by untouched zero pages until first write);
   * **tracemalloc**: the traced peak while building a second pool. It sees every Python and
     numpy allocation at its requested size (numpy reports its buffers to tracemalloc),
     touched or not, but nothing allocated behind Python's back;

   ``bytes_per_block`` is the larger of the two, divided by N;
3. time: ``repeat`` constructions (each pool dropped before the next), median seconds.

Where ``/proc`` is unavailable the RSS figure falls back to ``ru_maxrss`` growth, which only
sees growth beyond the process's earlier peak.
"""

from __future__ import annotations

import json
import subprocess
import sys

from kvpool.bench.config import BenchConfig, size_label
from kvpool.errors import KvPoolError

_CHILD = r"""
import gc, json, resource, statistics, sys, time, tracemalloc
backend, n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def status_kb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False

began = time.perf_counter()
from kvpool.backends import backend_class
cls = backend_class(backend)
small = cls(64)
small.free_blocks(small.get_new_blocks(8))
del small
warmup_s = time.perf_counter() - began

gc.collect()
before_kb = status_kb("VmRSS")
if before_kb is not None and reset_peak():
    pool = cls(n)
    rss_bytes = (max(status_kb("VmHWM"), status_kb("VmRSS")) - before_kb) * 1024
else:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pool = cls(n)
    rss_bytes = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
del pool
gc.collect()

tracemalloc.start()
pool = cls(n)
traced_bytes = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
del pool
gc.collect()

times = []
for _ in range(repeat):
    t = time.perf_counter()
    pool = cls(n)
    times.append(time.perf_counter() - t)
    del pool
    gc.collect()
print(json.dumps({"warmup_s": warmup_s, "seconds": statistics.median(times),
                  "rss_bytes": rss_bytes, "traced_bytes": traced_bytes}))
"""


def measure_construction(backend: str, num_blocks: int, repeat: int) -> dict[str, float]:
    """One (backend, N) measurement in a fresh subprocess (see the module docstring)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, backend, str(num_blocks), str(repeat)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise KvPoolError(f"construct benchmark of {backend} at {num_blocks} failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_construct(config: BenchConfig) -> dict[str, dict[str, float]]:
    """``{backend: {figure: value}}`` for every configured backend and pool size.

    Figures per size label L (``100k``, ``1M``): ``construct_L_s`` (median seconds),
    ``construct_L_bytes_per_block`` (the larger memory estimate), and both estimates
    separately as ``construct_L_rss_bytes_per_block`` / ``construct_L_traced_bytes_per_block``;
    plus ``warmup_s`` (the first size's warm-up).
    """
    results: dict[str, dict[str, float]] = {}
    for backend in config.backends:
        figures: dict[str, float] = {}
        for n in config.construct_sizes:
            m = measure_construction(backend, n, config.repeat)
            label = size_label(n)
            figures.setdefault("warmup_s", m["warmup_s"])
            figures[f"construct_{label}_s"] = m["seconds"]
            rss = max(m["rss_bytes"], 0) / n
            traced = m["traced_bytes"] / n
            figures[f"construct_{label}_bytes_per_block"] = max(rss, traced)
            figures[f"construct_{label}_rss_bytes_per_block"] = rss
            figures[f"construct_{label}_traced_bytes_per_block"] = traced
        results[backend] = figures
    return results


__all__ = ["measure_construction", "run_construct"]
