"""The hybrid fast policy's running steps: an idle step answered in ``O(groups)``, every
other running step taken straight on the managers (``FastHybridKVCacheManager._step``),
with the same results, tables, pool state and events as the generic policy, step by step.
(The whole-stack machine checks the same on random walks: tests/policy/test_stack_check.py.)"""

from __future__ import annotations

import pytest

from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    SchedulerRequest,
    SlidingWindowSpec,
    make_kv_cache_manager,
)
from kvpool.policy.fast_hybrid import FastHybridKVCacheManager

# A window of 65 tokens slides past a block in the step that needs a new block: a step
# whose budget depends on the window's block being freed first.
CONFIG = KVCacheConfig(80, (KVCacheGroupSpec(FullAttentionSpec(block_size=16)),
                            KVCacheGroupSpec(SlidingWindowSpec(block_size=16,
                                                               sliding_window=65))))


def hasher(request):
    n = len(request.block_hashes)
    return [f"{request.all_token_ids[:16 * (i + 1)]}".encode()
            for i in range(n, request.num_tokens // 16)]


def observed(manager, request):
    pool = manager.block_pool
    return (manager.get_blocks(request.request_id).get_block_ids(), pool.abstract().state,
            pool.take_events())


@pytest.mark.parametrize("watermark", [0.0, 0.2])
def test_running_steps_take_the_managers_path_and_decide_as_the_generic_policy(
        watermark) -> None:
    fast = make_kv_cache_manager(CONFIG, 2048, 16, 16, backend="fast",
                                 enable_kv_cache_events=True, watermark=watermark)
    generic = KVCacheManager(CONFIG, 2048, 16, 16, backend="fast",
                             enable_kv_cache_events=True, watermark=watermark)
    assert type(fast) is FastHybridKVCacheManager
    steps = []
    real_step = fast._step

    def spy(*args):
        steps.append(args[1])
        return real_step(*args)

    fast._step = spy
    requests = {m: [SchedulerRequest(f"r{i}", list(range(i, i + 40 + 7 * i)),
                                     block_hasher=hasher) for i in range(3)]
                for m in (fast, generic)}
    for m, reqs in requests.items():  # admissions (the generic code on both)
        for r in reqs:
            hits, n = m.get_computed_blocks(r)
            assert m.allocate_slots(r, r.num_tokens - n, n, hits) is not None
            r.num_computed_tokens = r.num_tokens
    refused = 0
    for token in range(300):  # decode until the pool runs out: refusals included
        for i in range(3):
            answers = []
            for m, reqs in requests.items():
                r = reqs[i]
                r.append_output_token_ids(1000 + token)
                new = m.allocate_slots(r, 1)
                if new is not None:
                    r.num_computed_tokens += 1
                answers.append((None if new is None else new.get_block_ids(),
                                observed(m, r)))
            assert answers[0] == answers[1], (token, i)
            refused += answers[0][0] is None
    assert len(steps) > 50  # window slides, new blocks, keyed blocks
    assert refused > 0  # the budget refused some steps, after freeing the windows
