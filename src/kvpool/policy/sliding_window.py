"""Sliding-window attention (BEHAVIOUR.md §8): a token sees the ``sliding_window`` tokens
ending at itself, so a hit needs only the last window's blocks — the ones before it are null.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.policy.manager import SingleTypeKVCacheManager, trim_to_alignment
from kvpool.policy.pool_access import cached_from_end
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
        """Scan right to left for the rightmost run of ``contiguous_blocks_for_hit`` hits
        whose end is aligned; everything before the run is null. Without a full run, only a
        run touching position 0 counts. Pure."""
        assert isinstance(kv_cache_spec, SlidingWindowSpec)
        bs = kv_cache_spec.block_size
        need = contiguous_blocks_for_hit(kv_cache_spec.sliding_window, bs, drop_eagle_block)
        max_blocks = min(max_length // bs, len(block_hashes))
        null = block_pool.null_block
        hits = tuple([null] * max_blocks for _ in kv_cache_group_ids)
        run = 0
        found = False
        # One window's worth of positions per pool call: a hit usually ends within it.
        looked_up = cached_from_end(block_pool, block_hashes, kv_cache_group_ids, max_blocks,
                                    need)
        for i, cached in zip(range(max_blocks - 1, -1, -1), looked_up, strict=True):
            if cached is None:
                run = 0
                continue
            if run == 0 and bs != alignment_tokens:
                end = i if drop_eagle_block else i + 1
                if end * bs % alignment_tokens:
                    continue  # a run must end where an aligned hit can end
            for blocks, b in zip(hits, cached, strict=True):
                blocks[i] = b
            run += 1
            if run >= need:
                for blocks in hits:
                    del blocks[i + run:]
                found = True
                break
        if not found:
            for blocks in hits:
                del blocks[run:]
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
        if alignment_tokens is None:
            return None
        assert isinstance(kv_cache_spec, SlidingWindowSpec)
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
            if need >= per_segment:
                return None
            for i in range(start_block, end_block):
                if i >= shift and (i - shift) % per_segment >= per_segment - need:
                    mask[i - start_block] = True
        if retention_interval is not None and num_prompt_tokens is not None:
            boundary = (num_prompt_tokens - 1) // alignment_tokens * alignment_tokens
            end = boundary // bs + shift
            for i in range(max(start_block, end - need), min(end_block, end)):
                mask[i - start_block] = True
        return mask

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the window of the next token: ``max(0, n − window + 1)``."""
        assert isinstance(self.kv_cache_spec, SlidingWindowSpec)
        return max(0, num_computed_tokens - self.kv_cache_spec.sliding_window + 1)

    def fewest_tokens_skipping(self, num_blocks: int) -> int:
        """The fewest computed tokens whose skipped tokens cover ``num_blocks >= 1`` whole
        blocks: :meth:`get_num_skipped_tokens` inverted, ``num_blocks · bs + window − 1``."""
        assert isinstance(self.kv_cache_spec, SlidingWindowSpec)
        return num_blocks * self.block_size + self.kv_cache_spec.sliding_window - 1


__all__ = ["SlidingWindowManager", "contiguous_blocks_for_hit"]
