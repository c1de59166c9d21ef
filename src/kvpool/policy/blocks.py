"""``KVCacheBlocks``: a per-group tuple of block-id lists, the facade's result type."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal, overload


@dataclass(frozen=True)
class KVCacheBlocks:
    """``blocks[g][j]`` = block id of group ``g``'s ``j``-th block position.

    The facade returns one shared empty instance whenever no group has blocks (vLLM does the
    same to avoid allocations); passing that instance back to ``allocate_slots`` means
    "no prefix hits".
    """

    blocks: tuple[Sequence[int], ...]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(list(chain(a, b))
                                   for a, b in zip(self.blocks, other.blocks, strict=True)))

    @overload
    def get_block_ids(self, allow_none: Literal[False] = False) -> tuple[list[int], ...]: ...

    @overload
    def get_block_ids(self, allow_none: bool) -> tuple[list[int], ...] | None: ...

    def get_block_ids(self, allow_none: bool = False) -> tuple[list[int], ...] | None:
        """The ids per group as fresh lists; ``None`` if ``allow_none`` and all are empty."""
        if allow_none and not any(self.blocks):
            return None
        return tuple(list(group) for group in self.blocks)

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in self.blocks))


__all__ = ["KVCacheBlocks"]
