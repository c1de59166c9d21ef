"""Which inputs each reference operation rejects: :mod:`kvpool.spec.preconditions`, over objects.

One function per spec function, same name, same checks in the same order, same error types;
only the reads differ (``pool.blocks[b].ref_cnt`` instead of ``state.ref_cnt[b]``). Each
returns the error the operation raises, or ``None`` when the arguments are valid, and reads
nothing it does not need, so validation costs O(batch), never O(pool). The pool raises the
result before it changes anything. Contract checking (:mod:`kvpool.reference.contracts`)
verifies the agreement call by call.

The state-free checks (counts, group ids) are the spec's own functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvpool.errors import (
    CachingDisabled,
    DoubleFree,
    HashStateError,
    InvalidArgument,
    InvalidBlockId,
    KvPoolError,
    NoFreeBlocks,
    NotQueued,
    NullBlockMisuse,
)
from kvpool.reference.free_queue import is_queued
from kvpool.spec.preconditions import bad_group_id, is_count
from kvpool.spec.state import NULL_BLOCK_ID

if TYPE_CHECKING:
    from kvpool.reference.pool import ReferenceBlockPool


def bad_block_id(pool: ReferenceBlockPool, block_ids: Sequence[int]) -> KvPoolError | None:
    """The first id outside ``[0, num_blocks)``, as an error."""
    n = len(pool.blocks)
    for b in block_ids:
        if not 0 <= b < n:
            return InvalidBlockId(f"block id {b} is out of range [0, {n})")
    return None


def bad_block_size(pool: ReferenceBlockPool, block_size: object) -> KvPoolError | None:
    hbs = pool.hash_block_size
    valid = isinstance(block_size, int) and is_count(block_size) and block_size > 0
    if not valid or block_size % hbs != 0:  # type: ignore[operator]
        return InvalidArgument(
            f"block_size {block_size!r} must be a positive multiple of hash_block_size {hbs}"
        )
    return None


def num_hashes_at(pool: ReferenceBlockPool, block_hashes: Sequence[bytes], block_size: int) -> int:
    """How many hashes a request has at ``block_size`` granularity (the coarse view, §1)."""
    return len(block_hashes) // (block_size // pool.hash_block_size)


def over_release(pool: ReferenceBlockPool, block_ids: Sequence[int]) -> KvPoolError | None:
    """A block released more times in this batch than it has references (null excluded)."""
    releases: dict[int, int] = {}
    for b in block_ids:
        if b != NULL_BLOCK_ID:
            releases[b] = releases.get(b, 0) + 1
    # Iterated in first-seen order, so the first offending block of the batch is reported.
    for b, count in releases.items():
        ref_cnt = pool.blocks[b].ref_cnt
        if count > ref_cnt:
            return DoubleFree(f"block {b} is released {count} time(s) but has ref_cnt {ref_cnt}")
    return None


def get_new_blocks_rejection(pool: ReferenceBlockPool, num_blocks: object) -> KvPoolError | None:
    if not is_count(num_blocks):
        return InvalidArgument(f"num_blocks must be a non-negative int, got {num_blocks!r}")
    assert isinstance(num_blocks, int)
    if num_blocks > pool.free_block_queue.num_free_blocks:
        return NoFreeBlocks(f"Cannot get {num_blocks} free blocks from the pool")
    return None


def touch_rejection(pool: ReferenceBlockPool, block_ids: Sequence[int]) -> KvPoolError | None:
    error = bad_block_id(pool, block_ids)
    if error:
        return error
    # Cannot happen in a consistent pool (ref 0 ⇔ queued), so the spec has no such check; it
    # is made here so that a corrupted pool fails before the batch is half touched.
    for b in block_ids:
        block = pool.blocks[b]
        if not block.is_null and block.ref_cnt == 0 and not is_queued(block):
            return NotQueued(f"touch: block {b} has ref_cnt 0 but is not in the free queue")
    return None


def free_blocks_rejection(pool: ReferenceBlockPool, block_ids: Sequence[int]) -> KvPoolError | None:
    return bad_block_id(pool, block_ids) or over_release(pool, block_ids)


def unpin_blocks_rejection(
    pool: ReferenceBlockPool, block_ids: Sequence[int]
) -> KvPoolError | None:
    error = bad_block_id(pool, block_ids)
    if error:
        return error
    if NULL_BLOCK_ID in block_ids:
        return NullBlockMisuse("unpin_blocks got the null block (id 0)")
    return over_release(pool, block_ids)


def get_cached_block_rejection(
    pool: ReferenceBlockPool, block_hash: object, group_ids: Sequence[int]
) -> KvPoolError | None:
    if not isinstance(block_hash, bytes):
        return InvalidArgument(f"block_hash must be bytes, got {type(block_hash).__name__}")
    if not group_ids:
        return InvalidArgument("get_cached_block needs at least one group id")
    for g in group_ids:
        error = bad_group_id(g)
        if error:
            return error
    return None


def cache_full_blocks_rejection(
    pool: ReferenceBlockPool,
    block_hashes: Sequence[bytes],
    block_ids: Sequence[int],
    num_cached: object,
    num_full: object,
    block_size: object,
    group_id: object,
    mask: Sequence[bool] | None,
) -> KvPoolError | None:
    if not pool.enable_caching:
        return CachingDisabled("cache_full_blocks on a pool with caching disabled")
    error = bad_group_id(group_id)
    if error:
        return error
    if not is_count(num_cached) or not is_count(num_full):
        return InvalidArgument(
            f"num_cached_blocks {num_cached!r} and num_full_blocks {num_full!r} "
            "must be non-negative ints"
        )
    assert isinstance(num_cached, int) and isinstance(num_full, int)
    if num_cached >= num_full:
        return None  # a silent no-op in vLLM; nothing else is read
    error = bad_block_size(pool, block_size)
    if error:
        return error
    assert isinstance(block_size, int)
    if num_full > len(block_ids):
        return InvalidArgument(f"num_full_blocks {num_full} > {len(block_ids)} blocks given")
    if mask is not None and len(mask) != num_full - num_cached:
        return InvalidArgument(
            f"block_mask has {len(mask)} entries for {num_full - num_cached} candidates"
        )
    available = num_hashes_at(pool, block_hashes, block_size)
    if available < num_full:
        return InvalidArgument(
            f"request has {available} block hashes at block_size {block_size}, needs {num_full}"
        )
    candidates = block_ids[num_cached:num_full]
    error = bad_block_id(pool, candidates)
    if error:
        return error
    seen: set[int] = set()
    for i, b in enumerate(candidates):
        if b == NULL_BLOCK_ID or (mask is not None and not mask[i]):
            continue
        if b in seen:
            return InvalidArgument(f"block {b} appears twice among the blocks to cache")
        seen.add(b)
        block = pool.blocks[b]
        if block.ref_cnt == 0:
            return HashStateError(f"cannot cache free block {b} (ref_cnt 0)")
        k = num_cached + i
        tokens = block.block_hash_num_tokens
        if tokens is not None and tokens >= (k + 1) * block_size:
            return HashStateError(
                f"block {b} already carries a key covering {tokens} tokens "
                f"(caching it at position {k} would cover {(k + 1) * block_size})"
            )
    return None


def cache_partial_block_rejection(
    pool: ReferenceBlockPool,
    block_hashes: Sequence[bytes],
    block_id: int,
    num_tokens: object,
    group_id: object,
    block_size: object,
) -> KvPoolError | None:
    if not pool.enable_caching:
        return CachingDisabled("cache_partial_block on a pool with caching disabled")
    error = bad_block_id(pool, (block_id,))
    if error or block_id == NULL_BLOCK_ID:
        return error  # the null block is a silent no-op (returns None)
    error = bad_group_id(group_id) or bad_block_size(pool, block_size)
    if error:
        return error
    hbs = pool.hash_block_size
    if not isinstance(num_tokens, int) or not is_count(num_tokens) or num_tokens % hbs != 0:
        return InvalidArgument(f"num_tokens {num_tokens!r} is not a multiple of hbs {hbs}")
    if not 0 < num_tokens // hbs <= len(block_hashes):
        return InvalidArgument(
            f"num_tokens {num_tokens} needs {num_tokens // hbs} block hashes; "
            f"the request has {len(block_hashes)}"
        )
    if pool.blocks[block_id].ref_cnt == 0:
        return HashStateError(f"cannot cache free block {block_id} (ref_cnt 0)")
    return None


def move_block_hashes_rejection(pool: ReferenceBlockPool, src: int, dst: int) -> KvPoolError | None:
    if not pool.enable_caching:
        return CachingDisabled("move_block_hashes on a pool with caching disabled")
    error = bad_block_id(pool, (src, dst))
    if error:
        return error
    if NULL_BLOCK_ID in (src, dst):
        return NullBlockMisuse(f"move_block_hashes({src}, {dst}) involves the null block")
    if src == dst:
        return InvalidArgument(f"move_block_hashes source and destination are both {src}")
    if pool.blocks[dst].block_hash is not None:
        return HashStateError(f"destination block {dst} already has a cache key")
    for b in (src, dst):
        if pool.blocks[b].ref_cnt == 0:
            return HashStateError(f"move_block_hashes on free block {b} (ref_cnt 0)")
    return None


def is_block_writable_rejection(pool: ReferenceBlockPool, block_id: int) -> KvPoolError | None:
    return bad_block_id(pool, (block_id,))


def evict_blocks_rejection(
    pool: ReferenceBlockPool, block_ids: Sequence[int]
) -> KvPoolError | None:
    return bad_block_id(pool, block_ids)


def emit_cached_block_events_rejection(
    pool: ReferenceBlockPool,
    block_hashes: Sequence[bytes],
    num_cached: object,
    block_size: object,
    group_id: object,
) -> KvPoolError | None:
    error = bad_group_id(group_id) or bad_block_size(pool, block_size)
    if error:
        return error
    assert isinstance(block_size, int)
    if not is_count(num_cached):
        return InvalidArgument(f"num_cached_blocks must be a non-negative int, got {num_cached!r}")
    assert isinstance(num_cached, int)
    available = num_hashes_at(pool, block_hashes, block_size)
    if num_cached > available:
        return InvalidArgument(
            f"request has {available} block hashes at block_size {block_size}, needs {num_cached}"
        )
    return None
