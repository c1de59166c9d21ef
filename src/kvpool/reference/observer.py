"""Per-block facts read off the reference pool's block objects, as vLLM's managers read them
(:class:`kvpool.protocol.BlockObserver`)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import Any

from kvpool.shell.arguments import as_pool_block_ids


class ReferenceObserver:
    """O(1) per fact: ref counts and key lengths live on the block objects."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.blocks = pool.blocks

    def ref_cnts(self, block_ids: list[int]) -> list[int]:
        blocks = self.blocks
        return [blocks[b].ref_cnt for b in block_ids]

    def key_tokens(self, block_id: int) -> int | None:
        return self.blocks[block_id].block_hash_num_tokens

    def max_key_tokens(self, block_ids: Sequence[int]) -> int:
        blocks = self.blocks
        ids = as_pool_block_ids(block_ids, len(blocks))
        return max((blocks[b].block_hash_num_tokens or 0 for b in ids), default=0)

    def queue_front(self, n: int) -> list[int]:
        queued = self.pool.free_block_queue.iter_blocks_after(None)
        return [b.block_id for b in islice(queued, n)]


__all__ = ["ReferenceObserver"]
