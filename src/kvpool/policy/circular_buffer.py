"""The circular-buffer manager (BEHAVIOUR.md §8, vLLM 0.33 only): one block per request.

A circular-buffer group keeps a ring of ``block_size`` rows per request (vLLM uses it for
keys still being compressed). The request claims its single block at its first allocation
and keeps it until it is freed: no prefix hits, no caching, nothing falls out of a window.
The hybrid coordinator leaves such groups out of every lookup (their hit lists stay empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.errors import InvalidArgument
from kvpool.policy.full_attention import FullAttentionManager
from kvpool.policy.specs import KVCacheSpec


class CircularBufferManager(FullAttentionManager):
    """One ring block per request, claimed on first allocation; see the module docstring."""

    zeroed_spec_types = ()  # vLLM does not zero ring blocks
    supports_partial_hits = False

    def _claim_ring_block(self, request_id: str) -> list[int]:
        table = self.req_to_blocks.setdefault(request_id, [])
        if table:
            return []
        fresh = list(self.block_pool.get_new_blocks(1))
        table.extend(fresh)
        return fresh

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[int],
                                   total_computed_tokens: int, num_tokens_main_model: int,
                                   apply_admission_cap: bool = False,
                                   num_local_computed_tokens: int | None = None) -> int:
        return 0 if self.req_to_blocks.get(request_id) else 1

    def add_local_computed_blocks(self, request_id: str, new_computed_blocks: Sequence[int],
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int) -> None:
        if new_computed_blocks:
            raise InvalidArgument("circular-buffer groups take no prefix hits")

    def allocate_external_computed_blocks(self, request_id: str,
                                          num_local_computed_tokens: int,
                                          num_external_computed_tokens: int,
                                          record_for_zeroing: bool = True) -> None:
        self._claim_ring_block(request_id)  # never recorded: ring blocks are not zeroed

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int) -> list[int]:
        return self._claim_ring_block(request_id)

    def cache_blocks(self, request: Any, num_tokens: int,
                     retention_interval: int | None = None) -> None:
        return

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        return

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: Sequence[bytes], max_length: int,
                               kv_cache_group_ids: Sequence[int], block_pool: Any,
                               kv_cache_spec: KVCacheSpec, drop_eagle_block: bool,
                               alignment_tokens: int, dcp_world_size: int = 1,
                               pcp_world_size: int = 1) -> tuple[list[int], ...]:
        return tuple([] for _ in kv_cache_group_ids)


__all__ = ["CircularBufferManager"]
