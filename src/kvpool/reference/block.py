"""``KVCacheBlock``: one block's metadata, linked into the free queue in place (BEHAVIOUR.md §3).

A block carries its id, its reference count, at most one *primary* prefix-cache key (with the
number of prefix tokens that key covers) and the two links of the intrusive free queue. The
links live on the block itself so that queue operations allocate nothing. Secondary keys are
not stored here: the pool keeps them in a side index, because almost no block has any.

Blocks are compared and hashed by identity. Block ids are dense and fixed for the lifetime of
the pool (block tables are append-only), so two blocks with equal fields are still two blocks.
"""

from __future__ import annotations

from typing import Any

from kvpool.errors import HashStateError


class KVCacheBlock:
    """Metadata of one KV cache block (vLLM's ``KVCacheBlock``).

    ``ref_cnt`` counts the block's holders (``0`` ⇔ free, in the queue); it is not maintained
    for the null block. ``prev_free_block`` / ``next_free_block`` are both set while the block
    is queued and both ``None`` otherwise. ``pool`` names the owning pool (vLLM 0.30+); it takes
    no part in equality, which is identity.
    """

    __slots__ = (
        "block_id",
        "ref_cnt",
        "_block_hash",
        "_block_hash_num_tokens",
        "prev_free_block",
        "next_free_block",
        "is_null",
        "pool",
    )

    def __init__(self, block_id: int, pool: Any = None) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        # The primary key and its token count are set and cleared together (see set/reset).
        self._block_hash: bytes | None = None
        self._block_hash_num_tokens: int | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False
        self.pool = pool

    @property
    def block_hash(self) -> bytes | None:
        """The primary key (hash ‖ group id), or ``None`` when the block has no cache identity."""
        return self._block_hash

    @property
    def block_hash_num_tokens(self) -> int | None:
        """How many prefix tokens the primary key covers (``None`` without a key)."""
        return self._block_hash_num_tokens

    def set_block_hash(self, block_hash: bytes, num_tokens: int) -> None:
        """Give the block its primary key. O(1).

        Raises :class:`HashStateError` if it already has one: a key is replaced only by
        resetting first, so that its removal from the hash map is never forgotten.
        """
        if self._block_hash is not None:
            raise HashStateError("The block already has a hash. This should not happen.")
        self._block_hash = block_hash
        self._block_hash_num_tokens = num_tokens

    def reset_hash(self) -> None:
        """Drop the primary key and its token count (the block is evicted or reset). O(1)."""
        self._block_hash = None
        self._block_hash_num_tokens = None

    def __repr__(self) -> str:
        # Neighbours by id only: printing them whole would walk the entire queue.
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self._block_hash!r}, "
            f"_block_hash_num_tokens={self._block_hash_num_tokens}, "
            f"prev_free_block={prev_id}, next_free_block={next_id}, is_null={self.is_null})"
        )
