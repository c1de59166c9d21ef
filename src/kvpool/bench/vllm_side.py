"""The vLLM side of ``kvpool bench --vs-vllm``: the kit's own ``bench.py``, run on request.

Run by :mod:`kvpool.bench.vs_vllm` with the vLLM venv's python (stdlib only here: this file
never imports kvpool, so the vLLM venv needs nothing extra)::

    PY vllm_side.py KIT_DIR        # then one JSON command per stdin line

It imports the kit's ``bench.py`` (which imports vLLM and defines the workload), freezes the
import heap as ``bench.py`` does, and answers each command ``{"what": "trace" | "micro",
"clock": "wall" | "cpu"}`` with one JSON line: the dict that ``bench.py``'s ``run_trace`` or
``run_micro`` returns. With ``"cpu"`` the kit's timer (``time.perf_counter``) is replaced by
``time.thread_time`` for that call, so every figure of the kit's code is measured on the
thread's CPU clock instead, by the kit's own loops. ``{"what": "construct"}`` runs the kit's
``bench_construct`` (100k and 1M blocks, each in fresh vLLM processes) and answers its rows
by size. Before the first command the kit's trace loop runs once, untimed, on the first
requests (warm-up, as the kvpool side gets), and every command starts with a
``gc.collect()``. One long-lived process serves all rounds
so that the caller can interleave vLLM and kvpool runs without paying vLLM's ~9 s import per
round. ``{"what": "meta"}`` answers the versions; EOF ends the process.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys
import time

WARM_UP_REQUESTS = 40


def _load_bench(kit_dir: str):
    sys.path.insert(0, kit_dir)
    path = os.path.join(kit_dir, "bench.py")
    spec = importlib.util.spec_from_file_location("kit_bench", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: vllm_side.py KIT_DIR", file=sys.stderr)
        return 2
    bench = _load_bench(argv[0])
    trace, shared, _ = bench.builtin_trace()
    bench.freeze_gc_heap()
    # Warm-up, untimed, as the kvpool side warms up before its first timed run: the first
    # pass through the kit's loop pays for first calls (vLLM's lazy imports, code caches).
    bench.run_trace(trace[:WARM_UP_REQUESTS], None)
    out = sys.stdout
    for line in sys.stdin:
        command = json.loads(line)
        what = command.get("what")
        # Garbage of an earlier command is collected now, not inside the next timed run
        # (the kvpool side does the same before each of its runs).
        gc.collect()
        if what == "meta":
            result = {"vllm": bench.vllm.__version__, "python": sys.version.split()[0]}
        elif what == "construct":
            # The kit's own construction benchmark: each size in fresh vLLM processes.
            rows = bench.bench_construct(True)
            result = {str(row["n"]): row for row in rows}
        else:
            real = time.perf_counter
            if command.get("clock") == "cpu":
                time.perf_counter = time.thread_time
            try:
                if what == "trace":
                    result = bench.run_trace(trace, shared)
                else:  # the kit's micro loops, with the iteration count asked for
                    result = bench.run_micro(iters=int(command.get("iters", 200_000)))
            finally:
                time.perf_counter = real
        out.write(json.dumps(result) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
