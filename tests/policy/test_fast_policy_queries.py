"""The full-attention fast policy's own answer to the scheduler's per-step query, the
common-prefix count, against the generic policy's: with the prefix cache off (the coordinator
without a prefix cache says none, whatever the ref counts) and on (shared hits count)."""

from __future__ import annotations

import pytest

from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SchedulerRequest,
    make_kv_cache_manager,
)
from kvpool.policy.fast import FastKVCacheManager


def manager(policy: str, enable_caching: bool):
    config = KVCacheConfig(64, [KVCacheGroupSpec(FullAttentionSpec(block_size=16))])
    return make_kv_cache_manager(config, 1024, 16, 16, enable_caching=enable_caching,
                                 backend="fast", policy=policy)


def admit(m, rid: str, prompt: list[int]) -> None:
    hasher = get_request_block_hasher(16, BlockHasher("sha256", seed="q"))
    request = SchedulerRequest(rid, prompt, block_hasher=hasher)
    hits, n = m.get_computed_blocks(request)
    assert m.allocate_slots(request, len(prompt) - n, n, hits) is not None


@pytest.mark.parametrize("enable_caching, one, two", [(False, [0], [0]), (True, [3], [2])])
def test_the_common_prefix_count_is_the_generic_policys(enable_caching, one, two) -> None:
    answers = {}
    for policy in ("fast", "generic"):
        m = manager(policy, enable_caching)
        assert isinstance(m, FastKVCacheManager) == (policy == "fast")
        admit(m, "a", list(range(40)))  # one request: it alone holds its 3 blocks
        first = m.get_num_common_prefix_blocks("a")
        admit(m, "b", list(range(36)) + [99] * 8)  # shares the 2 full blocks a prefix hit gives
        answers[policy] = (first, m.get_num_common_prefix_blocks("a"))
    assert answers["fast"] == answers["generic"] == (one, two)
