"""The GPU layer: the pool's decisions applied to real KV tensors (torch).

* :class:`~kvpool.gpu.kv_cache.PagedKVCache` — paged K/V per layer per group, one flat
  allocation, sized and checked against free memory before allocating;
* :class:`~kvpool.gpu.block_table.BlockTables` — per-request rows, uploaded row by row, and
  the jitted, bounds-checked slot mapping; :func:`~kvpool.gpu.block_table.write_kv`;
* :class:`~kvpool.gpu.copier.BlockCopier` — the manager's copy-on-write pairs, one launch per
  step, endpoints released after the step;
* :class:`~kvpool.gpu.swap.Offloader` — swap to pinned host memory with ``unpin_blocks``
  semantics.

See ``docs/gpu.md``. Needs torch (the ``gpu`` extra); CUDA kernels need numba-cuda.
"""

from kvpool.gpu.block_table import BlockTable, BlockTables, write_kv
from kvpool.gpu.copier import BlockCopier, CopyStats
from kvpool.gpu.errors import InvalidCopyPair, InvalidSlot, KVCacheDoesNotFit
from kvpool.gpu.kv_cache import PagedKVCache
from kvpool.gpu.swap import NO_COPY, Offloader, SwapOut

__all__ = [
    "NO_COPY",
    "BlockCopier",
    "BlockTable",
    "BlockTables",
    "CopyStats",
    "InvalidCopyPair",
    "InvalidSlot",
    "KVCacheDoesNotFit",
    "Offloader",
    "PagedKVCache",
    "SwapOut",
    "write_kv",
]
