"""The facade trace benchmark (``benchmarks/bench_facade_trace.py``) runs, and every facade
in it decides alike: kvpool's alone on the kit's trace (needs the kit's ``gen_trace.py``,
``../shared/vllm-kit`` or ``KVPOOL_VLLM_KIT``), and against vLLM's own ``KVCacheManager``
in each kit's venv (``KVPOOL_VLLM025_PYTHON`` / ``KVPOOL_VLLM033_PYTHON``; skipped without)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvpool.bench.facade_trace import MODELS, run
from kvpool.bench.vs_vllm import default_kit

ROOT = Path(__file__).resolve().parents[2]
KIT = default_kit() or str(ROOT.parent / "shared" / "vllm-kit")
HAS_TRACE = os.path.exists(os.path.join(KIT, "gen_trace.py"))
needs_kit = pytest.mark.skipif(not HAS_TRACE, reason="no vLLM kit (../shared/vllm-kit)")


@needs_kit
def test_kvpool_facades_replay_the_kit_trace_and_decide_alike():
    result = run(MODELS, ("reference", "fast"), num_requests=40, repeat=1, num_blocks=512,
                 kit_dir=KIT, with_vllm=False)
    for model in MODELS:
        figures = result["models"][model]
        assert set(figures) == {"reference", "fast"}  # run() raises if decisions differ
        fast = figures["fast"]
        assert fast["blocks_allocated"] > 0 and fast["calls"] > 2 * 40
        assert fast["wall_s"] > 0 and "vs_vllm_cpu" not in fast


def test_without_a_kit_the_benchmark_says_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match="gen_trace.py"):
        run(("full",), ("fast",), kit_dir=str(tmp_path), with_vllm=False)


@pytest.mark.parametrize("version", ["025", "033"])
def test_vllm_facade_decides_as_kvpool_on_each_kit(version):
    python = os.environ.get(f"KVPOOL_VLLM{version}_PYTHON")
    if not python or not HAS_TRACE:
        pytest.skip(f"set KVPOOL_VLLM{version}_PYTHON to a vLLM kit's python")
    kit_root = Path(os.path.abspath(python)).parents[2]  # <kit>/venv/bin/python
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{kit_root / 'kvpool-deps'}",
           "VLLM_LOGGING_LEVEL": "ERROR", "KVPOOL_VLLM_KIT": KIT,
           "NUMBA_CACHE_DIR": str(kit_root / "numba-cache")}
    done = subprocess.run(
        [python, str(ROOT / "benchmarks" / "bench_facade_trace.py"), "--requests", "60",
         "--repeat", "1", "--num-blocks", "1024", "--backends", "fast", "--json"],
        capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    for model in MODELS:  # the run fails unless vLLM and kvpool made the same decisions
        figures = result["models"][model]
        assert figures["vllm"]["blocks_allocated"] == figures["fast"]["blocks_allocated"] > 0
        assert figures["fast"]["vs_vllm_cpu"] > 0
