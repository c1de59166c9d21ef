"""Full attention and its variants: MLA, R-SWA, sinks (BEHAVIOUR.md §8).

Every token attends to every earlier token, so a hit is simply the longest cached prefix:
hashes are chained, so the scan stops at the first miss. R-SWA frees the *gap* between the
prompt and its decode window; sink attention is full attention with a validated sink length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.policy.manager import SingleTypeKVCacheManager, trim_to_alignment
from kvpool.policy.pool_access import longest_prefix_hit, ref_cnts
from kvpool.policy.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    RSWASpec,
    cdiv,
)


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention (and MLA): keeps every block until the request finishes."""

    zeroed_spec_types = (FullAttentionSpec, MLAAttentionSpec)

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

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks whose ref count equals the number of tracked requests (every
        request holds them: cascade attention can share them)."""
        table = self.req_to_blocks.get(running_request_id)
        if not table:
            return 0
        tracked = len(self.req_to_blocks)
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
