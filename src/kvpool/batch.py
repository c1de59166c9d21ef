"""Batch verbs: a request's prefix lookup, or its allocation + caching, as one call.

Contract: each function here is the *definition* of a batch verb, composed from the
:class:`~kvpool.protocol.BlockPool` verbs, so it works on every backend; a backend may offer
the same verb as a method that does the work in one step (``FastBlockPool`` does) and must
then return the same result and leave the same state and events. The harness compares the
two.

* :func:`find_longest_cache_hit` — the left-to-right scan of a full-attention lookup: the
  blocks of the longest prefix of ``block_hashes`` that every group has cached. Pure.
* :func:`allocate_and_cache` — ``get_new_blocks`` for the request's new blocks, then
  ``cache_full_blocks`` over the table ``blocks + new``, as ``allocate_slots`` does per group.

Argument errors are raised before anything changes, in the order the composed verbs would
raise them. An error that depends on the pool's state (the table lists a free block, a block
twice, a block with a longer key, a value that is not a block id) is found by the cache step
after the allocation here; ``FastBlockPool.allocate_and_cache`` finds it first and changes
nothing. Either way it means the caller's table is corrupt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpool.errors import CachingDisabled, InvalidArgument, KvPoolError, NoFreeBlocks
from kvpool.spec import preconditions as pre


@dataclass(frozen=True)
class _HashBlockSize:
    """What the spec's block-size check reads from a state."""

    hash_block_size: int


def check_lookup_arguments(
    block_hashes: Any, group_ids: tuple[int, ...], max_num_blocks: int | None
) -> list[bytes] | np.ndarray:
    """Validate a lookup; return the hashes to scan (at most ``max_num_blocks`` of them).

    ``block_hashes``: a sequence of ``bytes`` or a 2-D uint8 array (one hash per row).
    Errors: no group → InvalidArgument; a bad group id → InvalidGroupId; a bad limit or a
    hash that is not bytes → InvalidArgument.
    """
    if not group_ids:
        raise InvalidArgument("find_longest_cache_hit needs at least one group id")
    for g in group_ids:
        error = pre.bad_group_id(g)
        if error:
            raise error
    if max_num_blocks is not None and not pre.is_count(max_num_blocks):
        raise InvalidArgument(f"max_num_blocks must be a non-negative int, got {max_num_blocks!r}")
    if isinstance(block_hashes, np.ndarray):
        if block_hashes.ndim != 2 or block_hashes.dtype != np.uint8:
            raise InvalidArgument(
                f"a hash array must be 2-D uint8, got {block_hashes.dtype} {block_hashes.shape}"
            )
        return block_hashes if max_num_blocks is None else block_hashes[:max_num_blocks]
    hashes = list(block_hashes) if max_num_blocks is None else list(block_hashes)[:max_num_blocks]
    if set(map(type, hashes)) - {bytes}:
        for h in hashes:
            if not isinstance(h, bytes):
                raise InvalidArgument(f"block hashes must be bytes, got {type(h).__name__}")
    return hashes


def cache_arguments_rejection(
    enable_caching: bool,
    hash_block_size: int,
    num_hashes: int,
    table_len: int,
    num_cached: object,
    num_full: object,
    block_size: object,
    group_id: object,
    mask: Sequence[bool] | None,
) -> KvPoolError | None:
    """The state-free checks of ``cache_full_blocks``, in :mod:`kvpool.spec.preconditions`
    order (``num_cached >= num_full`` is a valid no-op and skips the rest)."""
    if not enable_caching:
        return CachingDisabled("cache_full_blocks on a pool with caching disabled")
    error = pre.bad_group_id(group_id)
    if error:
        return error
    if not pre.is_count(num_cached) or not pre.is_count(num_full):
        return InvalidArgument(
            f"num_cached_blocks {num_cached!r} and num_full_blocks {num_full!r} "
            "must be non-negative ints"
        )
    assert isinstance(num_cached, int) and isinstance(num_full, int)
    if num_cached >= num_full:
        return None
    error = pre.bad_block_size(_HashBlockSize(hash_block_size), block_size)  # type: ignore[arg-type]
    if error:
        return error
    assert isinstance(block_size, int)
    if num_full > table_len:
        return InvalidArgument(f"num_full_blocks {num_full} > {table_len} blocks given")
    if mask is not None and len(mask) != num_full - num_cached:
        return InvalidArgument(
            f"block_mask has {len(mask)} entries for {num_full - num_cached} candidates"
        )
    available = num_hashes // (block_size // hash_block_size)
    if available < num_full:
        return InvalidArgument(
            f"request has {available} block hashes at block_size {block_size}, "
            f"needs {num_full}"
        )
    return None


def allocation_rejection(num_blocks: object, num_free: int) -> KvPoolError | None:
    """The checks of ``get_new_blocks`` (a numpy integer counts as an int)."""
    if not pre.is_count(num_blocks):
        return InvalidArgument(f"num_blocks must be a non-negative int, got {num_blocks!r}")
    assert isinstance(num_blocks, int)
    if num_blocks > num_free:
        return NoFreeBlocks(f"Cannot get {num_blocks} free blocks from the pool")
    return None


def find_longest_cache_hit(
    pool: Any,
    block_hashes: Any,
    kv_cache_group_ids: Sequence[int],
    max_num_blocks: int | None = None,
) -> list[list[int]]:
    """One list per group id (in the order given) of the blocks of the longest prefix of
    ``block_hashes`` whose every position hits in every group; the lists have equal length.

    Position ``i`` is a hit iff ``get_cached_block(block_hashes[i], groups)`` is; the scan
    stops at the first miss (hashes are chained, so nothing after a miss can hit) or after
    ``max_num_blocks`` positions. Pure: nothing is touched. O(hits · groups).
    """
    groups = tuple(kv_cache_group_ids)
    hashes = check_lookup_arguments(block_hashes, groups, max_num_blocks)
    if isinstance(hashes, np.ndarray):
        hashes = [row.tobytes() for row in hashes]
    result: list[list[int]] = [[] for _ in groups]
    for block_hash in hashes:
        hit = pool.get_cached_block(block_hash, groups)
        if hit is None:
            break
        for blocks, b in zip(result, hit, strict=True):
            blocks.append(int(b))
    return result


def allocate_and_cache(
    pool: Any,
    request: Any,
    blocks: Sequence[object],
    num_new_blocks: int,
    num_cached_blocks: int,
    num_full_blocks: int,
    block_size: int,
    kv_cache_group_id: int,
    block_mask: Sequence[object] | None = None,
) -> list[int]:
    """Allocate ``num_new_blocks`` blocks for a request whose table is ``blocks``, then key
    positions ``[num_cached_blocks, num_full_blocks)`` of the table ``blocks + new``.

    Exactly ``new = pool.get_new_blocks(num_new_blocks)`` followed by
    ``pool.cache_full_blocks(request, [*blocks, *new], num_cached_blocks, num_full_blocks,
    block_size, kv_cache_group_id, block_mask)``; returns ``new``. Argument errors of both
    steps are raised before the allocation (see the module docstring for the rest).
    O(new + candidates).
    """
    n = int(num_new_blocks) if isinstance(num_new_blocks, np.integer) else num_new_blocks
    table = list(blocks)
    mask = None if block_mask is None else tuple(bool(m) for m in block_mask)
    error = allocation_rejection(n, pool.get_num_free_blocks())
    if error:
        raise error
    error = cache_arguments_rejection(
        pool.enable_caching, pool.hash_block_size, len(request.block_hashes),
        len(table) + n, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id, mask,
    )
    if error:
        raise error
    new = [int(b) for b in pool.get_new_blocks(n)]
    pool.cache_full_blocks(request, [*table, *new], num_cached_blocks, num_full_blocks,
                           block_size, kv_cache_group_id, mask)
    return new
