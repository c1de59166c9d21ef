"""The reference backend (``backend="reference"``): vLLM's block-pool structures, readable first.

Read in this order: :mod:`~kvpool.reference.block` (one block's metadata),
:mod:`~kvpool.reference.free_queue` (the intrusive free list),
:mod:`~kvpool.reference.hash_map` (the prefix-cache table), :mod:`~kvpool.reference.pool`
(the operations), then :mod:`~kvpool.reference.invariants` and
:mod:`~kvpool.reference.contracts` (how it is kept honest against :mod:`kvpool.spec`).
"""

from kvpool.reference.block import KVCacheBlock
from kvpool.reference.free_queue import FreeKVCacheBlockQueue
from kvpool.reference.hash_map import BlockHashToBlockMap
from kvpool.reference.pool import ReferenceBlockPool

__all__ = [
    "BlockHashToBlockMap",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "ReferenceBlockPool",
]
