"""Which coordinator serves a configuration: none without prefix caching, the unitary one
for a single group, the hybrid one (the fixed-point hit search) for several groups."""

from __future__ import annotations

from typing import Any

from kvpool.policy.coordinator import (
    KVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
)
from kvpool.policy.hybrid import HybridKVCacheCoordinator
from kvpool.policy.specs import KVCacheConfig


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig, max_model_len: int, max_num_batched_tokens: int,
    use_eagle: bool, enable_caching: bool, enable_kv_cache_events: bool, dcp_world_size: int,
    pcp_world_size: int, scheduler_block_size: int, hash_block_size: int,
    metrics_collector: Any = None, **kwargs: Any,
) -> KVCacheCoordinator:
    """Caching off → no prefix cache; one group → unitary; otherwise hybrid."""
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config, max_model_len, max_num_batched_tokens, use_eagle,
            enable_kv_cache_events, dcp_world_size, pcp_world_size, scheduler_block_size,
            hash_block_size, metrics_collector, **kwargs)
    cls = UnitaryKVCacheCoordinator if len(kv_cache_config.kv_cache_groups) == 1 \
        else HybridKVCacheCoordinator
    return cls(kv_cache_config, max_model_len, max_num_batched_tokens, use_eagle,
               enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
               scheduler_block_size, hash_block_size, metrics_collector, **kwargs)


__all__ = ["get_kv_cache_coordinator"]
