"""vLLM's block types over kvpool's block ids.

vLLM's scheduler and KV connectors read a manager's results as ``KVCacheBlocks`` holding
``KVCacheBlock`` objects. kvpool's pool speaks block ids. Two thin types bridge them:

* :class:`BlockView` — a ``KVCacheBlock`` (``isinstance`` holds) for one block id whose
  ``ref_cnt``, ``block_hash`` and ``block_hash_num_tokens`` read kvpool's pool when asked;
  one view per id, made once, so a result costs a list lookup per block;
* :class:`IdBlocks` — a ``KVCacheBlocks`` that keeps the ids it was made from:
  ``get_block_ids()`` (what the scheduler calls every step) never touches a view, and
  ``blocks`` (what ``+``, ``get_unhashed_block_ids`` and connectors read) is built on first use.

Imports vLLM: only :mod:`kvpool.vllm.manager` imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock


class BlockView(KVCacheBlock):
    """Block ``block_id`` of a kvpool pool, seen as vLLM's ``KVCacheBlock`` (read-only:
    the pool owns the state; the free-queue links are not modelled)."""

    def __init__(self, block_id: int, pool: Any) -> None:  # noqa: D107 - no parent init
        self.block_id = block_id  # type: ignore[misc]  # slot of KVCacheBlock (Any: no vLLM)
        self.is_null = block_id == pool.null_block  # type: ignore[misc]  # (as above)
        self.prev_free_block = None  # type: ignore[misc]  # (as above)
        self.next_free_block = None  # type: ignore[misc]  # (as above)
        self._pool = pool

    @property  # type: ignore[override]
    def ref_cnt(self) -> int:
        if self.is_null:
            return 0
        return int(self._pool.observe().ref_cnts([self.block_id])[0])

    @property
    def block_hash(self) -> bytes | None:
        """The block's primary key (hash ‖ group id), ``None`` when it has none."""
        if self.is_null or self._pool.observe().key_tokens(self.block_id) is None:
            return None
        return self._pool.abstract().primary_key[self.block_id]  # type: ignore[no-any-return]

    @property
    def block_hash_num_tokens(self) -> int | None:
        if self.is_null:
            return None
        return self._pool.observe().key_tokens(self.block_id)  # type: ignore[no-any-return]

    @property  # type: ignore[override]
    def _block_hash(self) -> bytes | None:
        return self.block_hash

    def set_block_hash(self, *_: object, **__: object) -> None:
        raise TypeError("kvpool's pool owns block hashes; a BlockView is read-only")

    def reset_hash(self) -> None:
        raise TypeError("kvpool's pool owns block hashes; a BlockView is read-only")

    def __repr__(self) -> str:
        return f"BlockView(block_id={self.block_id})"


class IdBlocks(KVCacheBlocks):
    """A ``KVCacheBlocks`` made from block ids (module docstring)."""

    def __init__(self, ids: tuple[Sequence[int], ...], views: Sequence[BlockView]) -> None:
        # vLLM's dataclass __init__ would store ``blocks``; here it is a lazy property.
        self.ids = ids
        self._views = views
        self._blocks: tuple[list[BlockView], ...] | None = None

    @property  # type: ignore[override]
    def blocks(self) -> tuple[list[BlockView], ...]:
        if self._blocks is None:
            views = self._views
            self._blocks = tuple([views[b] for b in group] for group in self.ids)
        return self._blocks

    def get_block_ids(self, allow_none: bool = False) -> Any:  # noqa: D102 - vLLM's contract
        ids = self.ids
        if allow_none and not any(ids):
            return None
        return tuple(list(group) for group in ids)


def block_ids_of(blocks: Any) -> tuple[list[int], ...]:
    """The ids of any ``KVCacheBlocks`` (an :class:`IdBlocks` or one of vLLM's own)."""
    if isinstance(blocks, IdBlocks):
        return tuple(list(group) for group in blocks.ids)
    return tuple([b.block_id for b in group] for group in blocks.blocks)


__all__ = ["BlockView", "IdBlocks", "block_ids_of"]
