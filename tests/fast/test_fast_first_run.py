"""The first run on a cold Numba disk cache: only what a run uses is compiled, and a hook
says which kernel is compiling (``kvpool simulate`` shows it on a terminal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

numba = pytest.importorskip("numba")

pytestmark = pytest.mark.skipif(numba.config.DISABLE_JIT, reason="about compiled code")

HOOKED = """
import json
from kvpool.fast import compiled
calls = []
with compiled.compile_hook(lambda name, seconds: calls.append([name, seconds is None])):
    compiled.kernel_set(True).init_state
print(json.dumps(calls))
"""


def _python(code: str, cache_dir: str | None = None) -> str:
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=True, timeout=300)
    return done.stdout


def test_the_hook_hears_a_compile_on_a_cold_cache_and_nothing_on_a_warm_one(tmp_path):
    cold = json.loads(_python(HOOKED, str(tmp_path)))
    assert cold == [["init_state", True], ["init_state", False]]  # before, then after
    assert json.loads(_python(HOOKED, str(tmp_path))) == []  # loaded from the disk cache


USED = """
import json, os
os.environ["KVPOOL_FAST_ONE_OP"] = "cached"
from kvpool.fast import compiled
from kvpool.workload.simulate import simulate
simulate(num_requests=20)
print(json.dumps(sorted(compiled._ENTRY_POINTS)))
"""


def test_a_simulate_run_binds_only_the_kernels_it_calls():
    # The fused batch verbs (admit_request, run_step) and the one-op verbs it never calls
    # are neither compiled nor loaded: a first run on a cold cache does not pay for them.
    # (kvpool simulate runs the fast policy: its admissions are touch + get_new_blocks +
    # cache_full_blocks, and its lookups probe one block before scanning.)
    used = set(json.loads(_python(USED)))
    assert {"cache_full_blocks", "lookup_blocks", "get_new_blocks_unkeyed", "touch",
            "lookup_one"} <= used
    assert not used & {"admit_request", "run_step", "touch_one", "free_one", "h_pop",
                       "h_lookup_one", "h_touch_one", "h_free_one", "allocate_and_cache"}
