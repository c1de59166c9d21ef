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
import json
from kvpool.fast import compiled
from kvpool.workload.simulate import simulate
simulate(num_requests=20)
print(json.dumps(sorted(compiled._ENTRY_POINTS)))
"""


def test_a_simulate_run_binds_only_the_kernels_it_calls():
    # The fused batch verbs (admit_request, run_step) and the one-op verbs it never calls
    # are neither compiled nor loaded: a first run on a cold cache does not pay for them.
    # (kvpool simulate runs the fast policy: with events on its admissions are touch +
    # get_new_blocks + cache_full_blocks, without (its warm-up runs both) allocate_and_cache,
    # and the block boundary of an async step take_and_key; its lookups probe one block
    # before scanning.)
    used = set(json.loads(_python(USED)))
    assert {"cache_full_blocks", "lookup_blocks", "get_new_blocks_unkeyed", "touch",
            "h_lookup_one", "allocate_and_cache", "take_and_key"} <= used
    assert not used & {"admit_request", "run_step", "lookup_one", "touch_one", "free_one",
                       "h_touch_one", "h_free_one"}


WARMED = """
import json
from kvpool.fast import compiled
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import SchedulerRequest
from kvpool.workload.models import MODELS, build_manager
from kvpool.workload.serving import serve
from kvpool.workload.simulate import HASH_SEED, _WARMUP_WORKLOAD, warm_up_engine
warm_up_engine("fast")
warmed = set(compiled._ENTRY_POINTS)
trace = _WARMUP_WORKLOAD.generate()
# an engine's manager, for each model shape, events off (vLLM's default) or on
for model, events in [(model, events) for model in MODELS for events in (False, True)]:
    manager = build_manager(model, 72, 16, 4096, enable_kv_cache_events=events)
    manager.record_no_blocks_to_zero()
    hasher = BlockHasher("sha256", seed=HASH_SEED)
    serve(manager, trace, block_size=16, max_running=4, hasher=hasher)
    # and stepped as vLLM's async scheduler steps: each step allocated before the previous
    # step's token is appended (the step that takes a block keys the one that filled)
    make = get_request_block_hasher(16, hasher)
    requests = [SchedulerRequest(f"async-{i}", list(range(7 * i, 7 * i + 20 + 9 * i)),
                                 block_hasher=make) for i in range(4)]
    for r in requests:
        hits, n = manager.get_computed_blocks(r)
        assert manager.allocate_slots(r, r.num_tokens - n, n, hits) is not None
        r.num_computed_tokens = r.num_tokens
    for token in range(40):
        for r in requests:
            assert manager.allocate_slots(r, 1) is not None
            r.num_computed_tokens += 1
            r.append_output_token_ids(token)
    for r in requests:
        manager.free(r)
print(json.dumps(sorted(set(compiled._ENTRY_POINTS) - warmed)))
"""


def test_after_the_warm_up_an_engine_binds_no_kernel_with_events_on_or_off():
    # What install() warms up is what an engine then calls: no kernel is compiled (or loaded
    # from the disk cache, ~0.25-5 s) inside a scheduler step, whichever way events are set
    # and whatever the model (a sliding window's lookups and Mamba's state moves call
    # kernels a full-attention engine never does).
    assert json.loads(_python(WARMED)) == []


SLIDING = """
import json
from kvpool.fast import compiled
from kvpool.hashing import BlockHasher
from kvpool.policy import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                           SlidingWindowSpec, make_kv_cache_manager)
from kvpool.workload.serving import serve
from kvpool.workload.simulate import HASH_SEED, _WARMUP_WORKLOAD, warm_up_manager
warm_up_manager("fast", model="full+swa")
heard = []
with compiled.compile_hook(lambda name, seconds: heard.append(name)):
    for events in (False, True):  # windows that slide in this trace: they free as they go
        groups = (KVCacheGroupSpec(FullAttentionSpec(block_size=16)),
                  KVCacheGroupSpec(SlidingWindowSpec(block_size=16, sliding_window=48)))
        manager = make_kv_cache_manager(KVCacheConfig(96, groups), 4096, 16, 16,
                                        enable_kv_cache_events=events, backend="fast")
        manager.record_no_blocks_to_zero()
        serve(manager, _WARMUP_WORKLOAD.generate(), block_size=16, max_running=4,
              hasher=BlockHasher("sha256", seed=HASH_SEED))
print(json.dumps(sorted(set(heard))))
"""


def test_after_a_hybrid_warm_up_a_sliding_window_compiles_nothing():
    # The warm-up trace is shorter than the model's window: it also slides a narrow one,
    # so the one-block frees of a window (h_free_one) compile there, not in a timed call.
    assert json.loads(_python(SLIDING)) == []
