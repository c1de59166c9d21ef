"""The vLLM side of ``kvpool bench --vs-vllm``: the kit's own ``bench.py``, run on request.

Run by :mod:`kvpool.bench.vs_vllm` with the vLLM venv's python (stdlib only here: this file
never imports kvpool, so the vLLM venv needs nothing extra)::

    PY vllm_side.py KIT_DIR        # then one JSON command per stdin line

It imports the kit's ``bench.py`` (which imports vLLM and defines the workload), freezes the
import heap as ``bench.py`` does, and answers each command ``{"what": "trace" | "micro",
"clock": "wall" | "cpu"}`` with one JSON line: the dict that ``bench.py``'s ``run_trace`` or
``run_micro`` returns. With ``"cpu"`` the kit's timer (``time.perf_counter``) is replaced by
``time.thread_time`` for that call, so every figure of the kit's code is measured on the
thread's CPU clock instead, by the kit's own loops. One long-lived process serves all rounds
so that the caller can interleave vLLM and kvpool runs without paying vLLM's ~9 s import per
round. ``{"what": "meta"}`` answers the versions; EOF ends the process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time


def _load_bench(kit_dir: str):
    sys.path.insert(0, kit_dir)
    spec = importlib.util.spec_from_file_location("kit_bench", os.path.join(kit_dir, "bench.py"))
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
    out = sys.stdout
    for line in sys.stdin:
        command = json.loads(line)
        what = command.get("what")
        if what == "meta":
            result = {"vllm": bench.vllm.__version__, "python": sys.version.split()[0]}
        else:
            real = time.perf_counter
            if command.get("clock") == "cpu":
                time.perf_counter = time.thread_time
            try:
                result = bench.run_trace(trace, shared) if what == "trace" else bench.run_micro()
            finally:
                time.perf_counter = real
        out.write(json.dumps(result) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
