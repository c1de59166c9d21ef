"""``BlockHashToBlockMap``: the prefix-cache table, key → block(s) (BEHAVIOUR.md §5).

A key (block hash ‖ group id) usually names one block, and is then stored as that block
itself. Several blocks can carry the same key — two requests computed the same prefix
independently, and block tables are append-only, so the duplicate is never merged away —
and then the key maps to an insertion-ordered dict ``block_id → block``. Lookups answer with
the earliest inserted surviving block.

Once a key has been promoted to a dict it stays one until it is empty: a dict of size 1 is
never collapsed back to a bare block. That keeps ``pop`` a single dict operation, and the
order of the survivors is already right.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvpool.reference.block import KVCacheBlock

CachedBlocks = KVCacheBlock | dict[int, KVCacheBlock]
"""What one key maps to: a single block, or several by id in insertion order."""


def _unexpected(value: object) -> AssertionError:
    # Only a bug inside this module can store anything else.
    return AssertionError(f"Invalid KV cache block type {type(value)}")


class BlockHashToBlockMap:
    """The prefix-cache table (vLLM's ``BlockHashToBlockMap``). Every operation is O(1).

    ``len()`` is the number of keys, not of blocks.
    """

    def __init__(self) -> None:
        self._cache: dict[bytes, CachedBlocks] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        """The block under ``key`` (the earliest inserted one among duplicates), or ``None``."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            return blocks
        if isinstance(blocks, dict):
            return next(iter(blocks.values()))
        raise _unexpected(blocks)

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        """Store ``block`` under ``key``; it becomes the newest duplicate if the key is taken.

        Inserting a block that is already there (same id) replaces it in place: the order of
        duplicates never changes except by insertion at the end.
        """
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif isinstance(blocks, KVCacheBlock):
            if blocks.block_id == block.block_id:
                self._cache[key] = block
            else:
                self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        elif isinstance(blocks, dict):
            blocks[block.block_id] = block
        else:
            raise _unexpected(blocks)

    def contain(self, key: bytes, block_id: int) -> bool:
        """Whether the exact pair ``(key, block_id)`` is stored."""
        blocks = self._cache.get(key)
        if blocks is None:
            return False
        if isinstance(blocks, KVCacheBlock):
            return blocks.block_id == block_id
        if isinstance(blocks, dict):
            return block_id in blocks
        raise _unexpected(blocks)

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        """Remove the pair ``(key, block_id)``; return the removed block, or ``None`` if absent.

        A single entry with another id is left alone. A dict loses that id and the key is
        dropped once the dict is empty (the table never holds empty entries).
        """
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id != block_id:
                return None
            del self._cache[key]
            return blocks
        if isinstance(blocks, dict):
            block = blocks.pop(block_id, None)
            if not blocks:
                del self._cache[key]
            return block
        raise _unexpected(blocks)

    def __len__(self) -> int:
        return len(self._cache)

    def items(self) -> Iterator[tuple[bytes, tuple[KVCacheBlock, ...]]]:
        """``(key, blocks under it, earliest first)`` for every key (state conversion). O(size)."""
        for key, blocks in self._cache.items():
            if isinstance(blocks, KVCacheBlock):
                yield key, (blocks,)
            elif isinstance(blocks, dict):
                yield key, tuple(blocks.values())
            else:
                raise _unexpected(blocks)

    def entries(self) -> Iterator[tuple[bytes, int, KVCacheBlock]]:
        """``(key, stored id, block)`` for every stored pair, including the id it is filed under."""
        for key, blocks in self._cache.items():
            if isinstance(blocks, KVCacheBlock):
                yield key, blocks.block_id, blocks
            elif isinstance(blocks, dict):
                for block_id, block in blocks.items():
                    yield key, block_id, block
            else:
                raise _unexpected(blocks)
