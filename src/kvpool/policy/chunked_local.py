"""Chunked local attention (BEHAVIOUR.md §8): tokens attend within their chunk only, so
every block before the current chunk is null and counts as computed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.policy.manager import SingleTypeKVCacheManager, check_blocks_to_skip
from kvpool.policy.specs import ChunkedLocalAttentionSpec, KVCacheSpec


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention; frees each chunk's blocks once the next chunk starts."""

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: Any,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[list[int], ...]:
        """Null up to the start of ``max_length``'s chunk, then hits left to right until the
        first miss. (EAGLE drop and mixed alignments are rejected at construction.)"""
        assert isinstance(kv_cache_spec, ChunkedLocalAttentionSpec)
        bs = kv_cache_spec.block_size
        chunk = kv_cache_spec.attention_chunk_size
        max_blocks = max_length // bs
        start = (max_length // chunk * chunk) // bs if max_length > 0 else 0
        null = block_pool.null_block
        hits = tuple([null] * start for _ in kv_cache_group_ids)
        groups = list(kv_cache_group_ids)
        for i in range(start, max_blocks):
            cached = block_pool.get_cached_block(block_hashes[i], groups)
            if cached is None:
                break
            for blocks, b in zip(hits, cached, strict=True):
                blocks.append(b)
        return hits

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the current chunk: ``floor(n / chunk) · chunk``."""
        assert isinstance(self.kv_cache_spec, ChunkedLocalAttentionSpec)
        chunk = self.kv_cache_spec.attention_chunk_size
        return num_computed_tokens // chunk * chunk

    def fewest_tokens_skipping(self, num_blocks: int) -> int:
        """The fewest computed tokens whose skipped tokens cover ``num_blocks >= 1`` whole
        blocks: :meth:`get_num_skipped_tokens` inverted, the first chunk start at or past
        ``num_blocks · bs``."""
        assert isinstance(self.kv_cache_spec, ChunkedLocalAttentionSpec)
        chunk = self.kv_cache_spec.attention_chunk_size
        return -(-check_blocks_to_skip(num_blocks) * self.block_size // chunk) * chunk


__all__ = ["ChunkedLocalAttentionManager"]
