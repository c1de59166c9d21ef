"""Spec → manager resolution (BEHAVIOUR.md §8): walk the spec's class hierarchy, most
specific class first, so a subclass of a known spec gets its parent's manager."""

from __future__ import annotations

from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.policy.chunked_local import ChunkedLocalAttentionManager
from kvpool.policy.circular_buffer import CircularBufferManager
from kvpool.policy.cross_attention import CrossAttentionManager
from kvpool.policy.full_attention import (
    FullAttentionManager,
    RSWAManager,
    SinkFullAttentionManager,
)
from kvpool.policy.mamba import MambaManager
from kvpool.policy.manager import SingleTypeKVCacheManager
from kvpool.policy.sliding_window import SlidingWindowManager
from kvpool.policy.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

MANAGER_FOR_SPEC: dict[type, type[SingleTypeKVCacheManager]] = {
    FullAttentionSpec: FullAttentionManager,  # MLA too (a subclass)
    RSWASpec: RSWAManager,
    SinkFullAttentionSpec: SinkFullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,  # SlidingWindowMLA too
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    MambaSpec: MambaManager,
    CrossAttentionSpec: CrossAttentionManager,
    CircularBufferSpec: CircularBufferManager,  # vLLM 0.33
}


def manager_class_for(spec: KVCacheSpec) -> type[SingleTypeKVCacheManager]:
    """The manager class of ``spec``; :class:`InvalidConfig` for an unknown spec."""
    for cls in type(spec).__mro__:
        manager = MANAGER_FOR_SPEC.get(cls)
        if manager is not None:
            return manager
    raise InvalidConfig(f"no manager for KV cache spec {type(spec).__name__}")


def make_manager(spec: KVCacheSpec, max_num_batched_tokens: int, max_model_len: int,
                 **kwargs: Any) -> SingleTypeKVCacheManager:
    """A manager for ``spec``; sliding-window and chunked-local ones get their admission
    cap (they recycle blocks, so a whole sequence never holds all of its blocks)."""
    if isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
        kwargs["max_admission_blocks_per_request"] = spec.max_admission_blocks_per_request(
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len)
    return manager_class_for(spec)(spec, **kwargs)


__all__ = ["MANAGER_FOR_SPEC", "make_manager", "manager_class_for"]
