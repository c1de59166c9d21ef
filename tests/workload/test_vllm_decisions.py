"""On the vLLM kit's trace the replay makes exactly vLLM 0.25.1's decisions.

The figures are those the kit's ``bench.py --only trace`` prints for the real vLLM
(``tests/workload/kit_trace.py``). Before the driver stopped computing each request's last
sampled token it allocated 215,536 blocks and evicted 193,646 in 2,049 steps.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool import make_pool
from kvpool.workload.driver import replay
from kvpool.workload.simulate import simulate
from kvpool.workload.trace import load_trace

from .kit_trace import (
    KIT_BLOCK_SIZE,
    KIT_MAX_RUNNING,
    KIT_POOL_BLOCKS,
    VLLM_025_DECISIONS,
    kit_trace,
)

KIT_DIR = Path(os.environ.get("KVPOOL_VLLM_KIT", Path(__file__).parents[3] / "shared" / "vllm-kit"))


@pytest.fixture(scope="module")
def trace():
    return kit_trace()


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="needs numba (fast)")
def test_the_kit_trace_replay_makes_vllms_decisions(trace):
    pool = make_pool(KIT_POOL_BLOCKS, backend="fast", hash_block_size=KIT_BLOCK_SIZE)
    report = replay(pool, trace, block_size=KIT_BLOCK_SIZE, max_running=KIT_MAX_RUNNING)
    decisions = report.decisions()
    assert {k: decisions[k] for k in VLLM_025_DECISIONS} == VLLM_025_DECISIONS
    assert pool.get_num_free_blocks() == KIT_POOL_BLOCKS - 1


@pytest.mark.skipif(not (KIT_DIR / "gen_trace.py").exists(),
                    reason="no vLLM kit (set KVPOOL_VLLM_KIT to its directory)")
def test_the_rebuilt_trace_is_the_kits_own(trace, tmp_path):
    out = tmp_path / "kit.jsonl"
    subprocess.run([sys.executable, str(KIT_DIR / "gen_trace.py"), str(out)], check=True,
                   capture_output=True)
    assert load_trace(out) == trace


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="needs numba (fast)")
def test_simulate_through_the_kv_cache_manager_makes_vllms_decisions(trace):
    """``kvpool simulate`` drives the facade, not the bare pool: same figures (issue 8 item
    2 kept through issue 12)."""
    report = simulate(trace, backend="fast", num_blocks=KIT_POOL_BLOCKS,
                      block_size=KIT_BLOCK_SIZE, max_running=KIT_MAX_RUNNING, warmup=False)
    decisions = report.decisions()
    assert {k: decisions[k] for k in VLLM_025_DECISIONS} == VLLM_025_DECISIONS
    assert report.preemptions == 0
