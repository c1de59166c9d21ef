"""The policy layer: what a scheduler calls, over any kvpool pool (BEHAVIOUR.md §8–10).

Layers, bottom up (each module one concern):

* :mod:`~kvpool.policy.specs` — KV cache group specs (full attention, MLA, sliding window,
  chunked local, Mamba, cross attention, R-SWA, sinks) and the model's cache config;
* single-type managers, one module per family — :mod:`~kvpool.policy.manager` (base),
  :mod:`~kvpool.policy.full_attention`, :mod:`~kvpool.policy.sliding_window`,
  :mod:`~kvpool.policy.chunked_local`, :mod:`~kvpool.policy.mamba`,
  :mod:`~kvpool.policy.cross_attention`, :mod:`~kvpool.policy.circular_buffer` (0.33);
  :mod:`~kvpool.policy.registry` maps spec → manager;
* coordinators — :mod:`~kvpool.policy.coordinator` (the base, no prefix cache, unitary),
  :mod:`~kvpool.policy.hybrid` (the fixed-point hit search) and
  :mod:`~kvpool.policy.coordinator_factory` (which one serves a configuration);
* the facade — :class:`~kvpool.policy.facade.KVCacheManager`.

Everything speaks to the pool through :class:`kvpool.protocol.BlockPool` only, so one
manager runs unchanged on the spec, the reference and the fast backend.
"""

from kvpool.policy.blocks import KVCacheBlocks
from kvpool.policy.coordinator import (
    KVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
)
from kvpool.policy.coordinator_factory import get_kv_cache_coordinator
from kvpool.policy.facade import BlockCopy, KVCacheManager
from kvpool.policy.factory import POLICIES, make_kv_cache_manager
from kvpool.policy.hybrid import HybridKVCacheCoordinator
from kvpool.policy.request import RequestStatus, SchedulerRequest
from kvpool.policy.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from kvpool.policy.stats import PrefixCacheStats

__all__ = [
    "BlockCopy",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "HybridKVCacheCoordinator",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "KVCacheSpec",
    "POLICIES",
    "MLAAttentionSpec",
    "MambaSpec",
    "PrefixCacheStats",
    "RSWASpec",
    "RequestStatus",
    "SchedulerRequest",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
    "make_kv_cache_manager",
]
