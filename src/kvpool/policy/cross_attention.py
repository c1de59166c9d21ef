"""Cross attention (BEHAVIOUR.md §8): blocks for encoder outputs, sized by encoder tokens,
never prefix-cached (a cross-attention group with caching on is rejected at construction)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.errors import CachingDisabled, InvalidArgument
from kvpool.policy.manager import SingleTypeKVCacheManager
from kvpool.policy.specs import KVCacheSpec


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Encoder-decoder cross attention: no hits, no external blocks, no caching."""

    def add_local_computed_blocks(self, request_id: str, new_computed_blocks: Sequence[int],
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int) -> None:
        if new_computed_blocks:
            raise InvalidArgument("cross-attention groups take no prefix hits")

    def allocate_external_computed_blocks(self, request_id: str,
                                          num_local_computed_tokens: int,
                                          num_external_computed_tokens: int,
                                          record_for_zeroing: bool = True) -> None:
        return

    def cache_blocks(self, request: Any, num_tokens: int,
                     retention_interval: int | None = None) -> None:
        raise CachingDisabled("Should not be called as prefix caching is disabled.")

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: Sequence[bytes], max_length: int,
                               kv_cache_group_ids: Sequence[int], block_pool: Any,
                               kv_cache_spec: KVCacheSpec, drop_eagle_block: bool,
                               alignment_tokens: int, dcp_world_size: int = 1,
                               pcp_world_size: int = 1) -> tuple[list[int], ...]:
        raise CachingDisabled("CrossAttentionManager does not support caching")


__all__ = ["CrossAttentionManager"]
