"""Sliding-window attention (BEHAVIOUR.md §8): a token sees the ``sliding_window`` tokens
ending at itself, so a hit needs only the last window's blocks — the ones before it are null.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kvpool.policy.manager import (
    SingleTypeKVCacheManager,
    check_blocks_to_skip,
    trim_to_alignment,
)
from kvpool.policy.pool_access import cached_run_from_end
from kvpool.policy.specs import KVCacheSpec, SlidingWindowSpec, cdiv


def contiguous_blocks_for_hit(window: int, block_size: int, use_eagle: bool) -> int:
    """Blocks a hit must cover behind its end: ``cdiv(window − 1, bs)``, one more when an
    EAGLE lookup will drop its last block."""
    return cdiv(window - 1, block_size) + (1 if use_eagle else 0)


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding window (and its MLA format): frees blocks that leave the window."""

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
        """The rightmost run of ``contiguous_blocks_for_hit`` hits whose end is aligned
        (everything before it null); without a full run, only a run from position 0 counts,
        trimmed to the alignment. Pure."""
        assert isinstance(kv_cache_spec, SlidingWindowSpec)
        bs = kv_cache_spec.block_size
        need = contiguous_blocks_for_hit(kv_cache_spec.sliding_window, bs, drop_eagle_block)
        max_blocks = min(max_length // bs, len(block_hashes))
        # A run may end at block p where an aligned hit can end: (p + 1) blocks, one fewer
        # when the EAGLE drop will take the run's last block, a multiple of the alignment.
        end_every = alignment_tokens // math.gcd(alignment_tokens, bs)
        if max_blocks <= 0:  # no position to read (a full-attention miss caps it at 0)
            return tuple([] for _ in kv_cache_group_ids)
        first, run = cached_run_from_end(block_pool, block_hashes, kv_cache_group_ids,
                                         max_blocks, need, end_every,
                                         1 if drop_eagle_block else 0)
        null = block_pool.null_block
        hits = tuple([null] * first + blocks for blocks in run)
        if len(run[0]) < need:  # no full run: the one from position 0, aligned
            trim_to_alignment(hits, bs, alignment_tokens)
        if drop_eagle_block and hits[0]:
            for blocks in hits:
                blocks.pop()
            trim_to_alignment(hits, bs, alignment_tokens)
        return hits

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: KVCacheSpec,
        use_eagle: bool,
        retention_interval: int | None = None,
        num_prompt_tokens: int | None = None,
    ) -> list[bool] | None:
        """Key only blocks a future aligned hit can use: the last ``need`` blocks of each
        segment (the alignment, or the retention interval), plus the run ending at the
        prompt's replay boundary when retention is on."""
        if cls._keys_every_block(alignment_tokens, kv_cache_spec, use_eagle, retention_interval):
            return None
        assert isinstance(kv_cache_spec, SlidingWindowSpec) and alignment_tokens is not None
        bs = kv_cache_spec.block_size
        need = contiguous_blocks_for_hit(kv_cache_spec.sliding_window, bs, use_eagle)
        shift = 1 if use_eagle else 0
        mask = [False] * (end_block - start_block)
        if retention_interval is None:
            segment: int | None = alignment_tokens
        else:
            segment = None if retention_interval == 0 else retention_interval
        if segment is not None:
            per_segment = segment // bs
            for i in range(start_block, end_block):
                if i >= shift and (i - shift) % per_segment >= per_segment - need:
                    mask[i - start_block] = True
        if retention_interval is not None and num_prompt_tokens is not None:
            boundary = (num_prompt_tokens - 1) // alignment_tokens * alignment_tokens
            end = boundary // bs + shift
            for i in range(max(start_block, end - need), min(end_block, end)):
                mask[i - start_block] = True
        return mask

    @staticmethod
    def _keys_every_block(alignment_tokens: int | None, kv_cache_spec: KVCacheSpec,
                          use_eagle: bool, retention_interval: int | None) -> bool:
        """Whether the mask keys every block, whatever the range: no alignment, or a
        segment (the alignment, or the retention interval) no longer than the run a hit
        needs."""
        if alignment_tokens is None:
            return True
        if retention_interval == 0:  # retention without segments: the replay boundary's run
            return False
        segment = alignment_tokens if retention_interval is None else retention_interval
        assert isinstance(kv_cache_spec, SlidingWindowSpec)
        bs = kv_cache_spec.block_size
        return contiguous_blocks_for_hit(kv_cache_spec.sliding_window, bs, use_eagle) \
            >= segment // bs

    def keys_every_block(self, retention_interval: int | None = None) -> bool:
        return self._keys_every_block(self.scheduler_block_size, self.kv_cache_spec,
                                      self.use_eagle, retention_interval)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the window of the next token: ``max(0, n − window + 1)``."""
        assert isinstance(self.kv_cache_spec, SlidingWindowSpec)
        return max(0, num_computed_tokens - self.kv_cache_spec.sliding_window + 1)

    def fewest_tokens_skipping(self, num_blocks: int) -> int:
        """The fewest computed tokens whose skipped tokens cover ``num_blocks >= 1`` whole
        blocks: :meth:`get_num_skipped_tokens` inverted, ``num_blocks · bs + window − 1``."""
        assert isinstance(self.kv_cache_spec, SlidingWindowSpec)
        return check_blocks_to_skip(num_blocks) * self.block_size \
            + self.kv_cache_spec.sliding_window - 1


__all__ = ["SlidingWindowManager", "contiguous_blocks_for_hit"]
