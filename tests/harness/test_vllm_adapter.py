"""The vLLM adapter's plumbing, against a vLLM-shaped fake (and against vLLM when installed).

The fake (``vllm_like_pool.py``) has vLLM's object API and internals and, like vLLM, checks
no input. On valid calls the harness must find it equal to the spec; on §12's invalid calls
it must report the documented divergences.
"""

from __future__ import annotations

import importlib.util

import pytest

from kvpool.errors import BackendUnavailable
from kvpool.harness import RAISE, Divergence, Foreign, lockstep, make_differential_test, run_check
from kvpool.harness.foreign.vllm_pool import VllmBlockPoolAdapter, make_vllm_pool
from kvpool.spec.invariants import violated_invariants

from .budget import budget
from .vllm_like_pool import VllmLikeBlockPool


def vllm_like(num_blocks: int, *, enable_caching: bool = True, hash_block_size: int = 16,
              enable_kv_cache_events: bool = False) -> VllmBlockPoolAdapter:
    """Harness factory: the fake vLLM pool behind the vLLM adapter."""
    pool = VllmLikeBlockPool(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events)
    return VllmBlockPoolAdapter(pool)


TestVllmShapedPoolAgreesOnValidCalls = make_differential_test(
    ["spec", vllm_like], invalid_calls=False, raising_watchers=False, settings=budget(60),
    name="VllmShapedValidCalls")


def test_adapter_reads_vllm_internals_into_the_spec_state():
    pool = lockstep(["spec", vllm_like], num_blocks=8, hash_block_size=2,
                    enable_kv_cache_events=True)
    request = pool.make_request([1, 2, 3, 4, 5, 6])
    pool.get_new_blocks(3)
    pool.cache_full_blocks(request, [1, 2, 3], 0, 3, 2, 0)
    pool.cache_partial_block(request, 3, 2, 1, 2)  # a secondary key, in another group
    pool.free_blocks([2])
    pool.get_new_blocks(5)  # pops 4..7 and evicts block 2 (the adapter numbers the event)
    state = pool.pools[1].abstract().state
    assert state == pool.state and not violated_invariants(state)
    assert len(state.secondary_keys[3]) == 1 and state.cache[state.secondary_keys[3][0]] == (3,)
    assert [e.seq for e in pool.take_events().value] == [0, 1, 2]


def test_foreign_blocks_reach_the_other_vllm_pool_through_block_pool():
    pool = lockstep(["spec", vllm_like], num_blocks=6)
    pool.sibling_get_new_blocks(2)
    pool.get_new_blocks(1)
    assert pool.free_blocks([Foreign(1), 1, Foreign(2)]).error is None
    assert pool.siblings[1].pool.blocks[1].ref_cnt == 0


def test_a_silent_double_free_is_reported_against_vllm():
    """§12 "double free": vLLM drives ref_cnt to -1 where kvpool raises DoubleFree."""
    pool = lockstep(["spec", vllm_like], num_blocks=4)
    pool.get_new_blocks(1)
    with pytest.raises(Divergence) as caught:
        pool.free_blocks([1, 1])
    assert caught.value.kind == "outcome" and "DoubleFree" in caught.value.detail


def test_a_negative_id_evicting_from_the_end_is_reported_against_vllm():
    """§12 "block ids out of range": vLLM indexes ``blocks[-1]``, kvpool raises InvalidBlockId."""
    pool = lockstep(["spec", vllm_like], num_blocks=4, hash_block_size=2)
    request = pool.make_request([1, 2])
    pool.get_new_blocks(3)
    pool.cache_full_blocks(request, [3], 0, 1, 2, 0)
    with pytest.raises(Divergence) as caught:
        pool.evict_blocks([-1])
    assert "InvalidBlockId" in caught.value.detail


def test_a_raising_watcher_is_reported_against_vllm():
    """§12 "exception raised by a reuse watcher": vLLM propagates it mid-allocation."""
    pool = lockstep(["spec", vllm_like], num_blocks=4)
    pool.get_new_blocks(2)
    pool.unpin_blocks([1, 2], RAISE)
    with pytest.raises(Divergence) as caught:
        pool.get_new_blocks(3)
    assert caught.value.kind == "outcome" and "WatcherError" in caught.value.detail


def test_invalid_calls_make_the_harness_report_vllm_divergences():
    report = run_check(["spec", vllm_like], 3000, seed=5, shrink=False)
    assert not report.ok and report.failure_kind in ("outcome", "rejected-mutated", "state")


def test_the_adapter_module_imports_without_vllm():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed")
    with pytest.raises(BackendUnavailable, match="vLLM"):
        make_vllm_pool(8)


def test_real_vllm_block_pool_through_the_adapter():
    pytest.importorskip("vllm")
    pool = make_vllm_pool(8, hash_block_size=16)
    ids = pool.get_new_blocks(3)
    assert ids == [1, 2, 3]
    pool.free_blocks(list(reversed(ids)))
    state = pool.abstract().state
    assert not violated_invariants(state) and len(state.free_queue) == 7
