"""Full attention and its variants: MLA, R-SWA, sinks (BEHAVIOUR.md §8).

Every token attends to every earlier token, so a hit is simply the longest cached prefix:
hashes are chained, so the scan stops at the first miss. R-SWA frees the *gap* between the
prompt and its decode window; sink attention is full attention with a validated sink length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.hashing.coarse import CoarseBlockHashes
from kvpool.policy.manager import SingleTypeKVCacheManager, trim_to_alignment
from kvpool.policy.pool_access import longest_prefix_hit, ref_cnt, ref_cnts
from kvpool.policy.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    RSWASpec,
    cdiv,
)


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention (and MLA): keeps every block until the request finishes."""

    zeroed_spec_types: tuple[type, ...] = (FullAttentionSpec, MLAAttentionSpec)
    supports_partial_hits = True

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
        """The longest cached prefix within ``max_length`` tokens, left to right; an EAGLE
        lookup drops its last block (the drafter needs its hidden states recomputed)."""
        block_size = kv_cache_spec.block_size * max(1, dcp_world_size * pcp_world_size)
        hits = tuple(longest_prefix_hit(block_pool, block_hashes, kv_cache_group_ids,
                                        max_length // block_size))
        if drop_eagle_block and hits[0]:
            for blocks in hits:
                blocks.pop()
        trim_to_alignment(hits, block_size, alignment_tokens)
        return hits

    @classmethod
    def find_longest_partial_cache_hit(
        cls,
        fine_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: Any,
        kv_cache_spec: KVCacheSpec,
    ) -> tuple[tuple[list[int], ...], int]:
        """The longest cached prefix at hash-block granularity (§10.4): the full blocks
        left to right, then the first missing block's interior boundaries, longest first.
        Returns the blocks (the last one may be only partly covered) and the hit tokens."""
        bs = kv_cache_spec.block_size
        hbs = block_pool.hash_block_size
        coarse = CoarseBlockHashes(fine_hashes, hbs, bs)
        hits = tuple(longest_prefix_hit(block_pool, coarse, kv_cache_group_ids,
                                        min(max_length // bs, len(coarse))))
        length = len(hits[0]) * bs
        ratio = bs // hbs
        first = len(hits[0]) * ratio
        last = min(first + ratio - 1, max_length // hbs, len(fine_hashes))
        for fine in range(last - 1, first - 1, -1):
            tail = block_pool.get_cached_block(fine_hashes[fine], list(kv_cache_group_ids))
            if tail is None:
                continue
            for blocks, b in zip(hits, tail, strict=True):
                blocks.append(b)
            length = (fine + 1) * hbs
            break
        return hits, length

    def cache_blocks(self, request: Any, num_tokens: int,
                     retention_interval: int | None = None) -> None:
        """Key the full blocks; with partial hits on, also the prompt's last hash-block
        boundary when it lies inside a block (a partial entry, §10.4)."""
        super().cache_blocks(request, num_tokens, retention_interval)
        if self.partial_hits and self.block_size != self.block_pool.hash_block_size:
            self._cache_partial_tail_block(request, num_tokens)

    def _cache_partial_tail_block(self, request: Any, num_tokens: int) -> None:
        """Register the prefix ending at the prompt's last usable hash boundary (a resend
        matches at most ``prompt − 1`` tokens) on the block it ends in. Full-attention KV
        is append-only, so the entry stays valid while the owner writes on."""
        hbs = self.block_pool.hash_block_size
        boundary = min((request.num_prompt_tokens - 1) // hbs,
                       len(request.block_hashes)) * hbs
        if boundary <= 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        table = self.req_to_blocks.get(request.request_id, [])
        position = boundary // self.block_size
        if position >= len(table):
            return
        self.block_pool.cache_partial_block(request, table[position], boundary,
                                            self.kv_cache_group_id, self.block_size)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks whose ref count equals the number of tracked requests (every
        request holds them: cascade attention can share them)."""
        table = self.req_to_blocks.get(running_request_id)
        if not table:
            return 0
        tracked = len(self.req_to_blocks)
        if ref_cnt(self.block_pool, table[0]) != tracked:
            return 0  # the usual answer, from one block (the scheduler asks every step)
        common = 0
        for count in ref_cnts(self.block_pool, table):
            if count != tracked:
                break
            common += 1
        return common


class RSWAManager(FullAttentionManager):
    """R-SWA: the prompt stays, decode keeps the last ``rswa_window`` tokens; the gap
    between them is freed (range removal, tail first)."""

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        if num_prompt_tokens is None:
            super().remove_skipped_blocks(request_id, total_computed_tokens)
            return
        assert isinstance(self.kv_cache_spec, RSWASpec)
        bs = self.block_size
        first_gap = cdiv(num_prompt_tokens, bs)
        window_start = max(num_prompt_tokens,
                           total_computed_tokens - self.kv_cache_spec.rswa_window)
        self._remove_blocks_in_range(request_id, first_gap, window_start // bs)


class SinkFullAttentionManager(FullAttentionManager):
    """Attention with sinks, as vLLM 0.33 has it: full attention whose spec validates
    ``sink_len`` (a positive multiple of bs, checked by the spec). 0.25.1 popped sink blocks
    off the free queue outside the ref-count invariant; kvpool does not (§12)."""


__all__ = ["FullAttentionManager", "RSWAManager", "SinkFullAttentionManager"]
