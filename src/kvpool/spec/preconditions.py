"""Which inputs each operation rejects, and with which typed error (BEHAVIOUR.md §12).

Every function here returns the error the operation raises for these arguments, or ``None``
when they are valid. Operations call them before touching anything, so a rejected call
leaves the pool exactly as it was. Checks run in a fixed order, and every backend reports the
*first* failing check: ids out of range before anything about their state, then the batch in
order. Argument conversion (sequences and numpy arrays to tuples of ints, foreign blocks)
happens before the spec is consulted, in :mod:`kvpool.shell`.

Phrasing note: checks test the *bad* case directly (``b < 0 or b >= n``, not
``not 0 <= b < n``). Same meaning, but CrossHair takes the true side of an untried branch only
a quarter of the time, so this way its symbolic arguments are valid far more often
(``docs/contracts.md``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TypeGuard

from kvpool.errors import (
    CachingDisabled,
    DoubleFree,
    HashStateError,
    InvalidArgument,
    InvalidBlockId,
    InvalidGroupId,
    KvPoolError,
    NoFreeBlocks,
    NullBlockMisuse,
    RefCountOverflow,
)
from kvpool.keys import is_valid_group_id
from kvpool.spec.state import MAX_REF_CNT, NULL_BLOCK_ID, PoolView, keys_of_block


def is_count(value: object) -> TypeGuard[int]:
    """A non-negative int (bools excluded)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def bad_block_id(state: PoolView, block_ids: Sequence[int]) -> KvPoolError | None:
    """The first id outside ``[0, num_blocks)``, as an error."""
    for b in block_ids:
        if b < 0 or b >= state.num_blocks:
            return InvalidBlockId(f"block id {b} is out of range [0, {state.num_blocks})")
    return None


def bad_group_id(group_id: object) -> KvPoolError | None:
    if not is_valid_group_id(group_id):
        return InvalidGroupId(f"group id {group_id!r} is not an int in [0, 2**32)")
    return None


def bad_block_size(state: PoolView, block_size: object) -> KvPoolError | None:
    hbs = state.hash_block_size
    if not is_count(block_size) or block_size == 0 or block_size % hbs != 0:
        return InvalidArgument(
            f"block_size {block_size!r} must be a positive multiple of hash_block_size {hbs}"
        )
    return None


def over_release(state: PoolView, block_ids: Sequence[int]) -> KvPoolError | None:
    """A block released more times in this batch than it has references (null excluded)."""
    releases: Counter[int] = Counter()
    for b in block_ids:
        if b == NULL_BLOCK_ID:
            continue
        releases[b] += 1
    for b in block_ids:
        if b == NULL_BLOCK_ID:
            continue
        if releases[b] > state.ref_cnt[b]:
            return DoubleFree(
                f"block {b} is released {releases[b]} time(s) but has ref_cnt {state.ref_cnt[b]}"
            )
    return None


def over_reference(state: PoolView, block_ids: Sequence[int]) -> KvPoolError | None:
    """A block this batch would take past ``MAX_REF_CNT`` references (null excluded): the
    first position, in batch order, whose block overflows."""
    limit = MAX_REF_CNT - len(block_ids)
    if all(state.ref_cnt[b] <= limit for b in block_ids):
        return None  # the common case: no block is anywhere near the limit
    takes: Counter[int] = Counter(b for b in block_ids if b != NULL_BLOCK_ID)
    for b in block_ids:
        if b != NULL_BLOCK_ID and state.ref_cnt[b] + takes[b] > MAX_REF_CNT:
            return RefCountOverflow(
                f"block {b} has ref_cnt {state.ref_cnt[b]}; {takes[b]} more reference(s) "
                f"would exceed the limit of {MAX_REF_CNT}"
            )
    return None


def bad_block_hashes(
    block_hashes: Sequence[object], num_cached: int, num_full: int, ratio: int
) -> KvPoolError | None:
    """The first hash a cache write of positions ``[num_cached, num_full)`` reads (fine index
    ``(k + 1) * ratio - 1`` for position ``k``) that is not ``bytes``.

    vLLM's block hashes are ``bytes``; anything else would be stored under a different key
    by each backend (``bytes(5)`` is five zero bytes). ``bytearray``/``memoryview`` are
    refused too: a key must not change after it is stored. A type check, so the shell and
    the batch checks run it at the boundary (the spec's operations take ``tuple[bytes,
    ...]``, which keeps their contracts small for CrossHair), once the call's other
    argument checks pass and before any state check.
    """
    for k in range(num_cached, num_full):
        i = (k + 1) * ratio - 1
        h = block_hashes[i]
        if not isinstance(h, bytes):
            return InvalidArgument(
                f"block_hashes[{i}] is {type(h).__name__}, not bytes (a block hash is bytes)"
            )
    return None


def get_new_blocks_rejection(state: PoolView, num_blocks: object) -> KvPoolError | None:
    if not is_count(num_blocks):
        return InvalidArgument(f"num_blocks must be a non-negative int, got {num_blocks!r}")
    if num_blocks > len(state.free_queue):
        return NoFreeBlocks(f"Cannot get {num_blocks} free blocks from the pool")
    return None


def touch_rejection(state: PoolView, block_ids: Sequence[int]) -> KvPoolError | None:
    # A non-null block with ref 0 is always queued (invariant 5), so NotQueued cannot arise
    # for a local id; vLLM's mid-batch RuntimeError has no id-based counterpart.
    return bad_block_id(state, block_ids) or over_reference(state, block_ids)


def free_blocks_rejection(state: PoolView, block_ids: Sequence[int]) -> KvPoolError | None:
    return bad_block_id(state, block_ids) or over_release(state, block_ids)


def unpin_blocks_rejection(state: PoolView, block_ids: Sequence[int]) -> KvPoolError | None:
    error = bad_block_id(state, block_ids)
    if error:
        return error
    if NULL_BLOCK_ID in block_ids:
        return NullBlockMisuse("unpin_blocks got the null block (id 0)")
    return over_release(state, block_ids)


def get_cached_block_rejection(
    state: PoolView, block_hash: object, group_ids: Sequence[int]
) -> KvPoolError | None:
    if not isinstance(block_hash, bytes):
        return InvalidArgument(f"block_hash must be bytes, got {type(block_hash).__name__}")
    if len(group_ids) == 0:
        return InvalidArgument("get_cached_block needs at least one group id")
    for g in group_ids:
        error = bad_group_id(g)
        if error:
            return error
    return None


def hashes_at_block_size(
    state: PoolView, block_hashes: tuple[bytes, ...], block_size: int
) -> tuple[bytes, ...]:
    """The request's hashes at ``block_size`` granularity (the coarse view, §1)."""
    ratio = block_size // state.hash_block_size
    if ratio == 1:
        return block_hashes
    return tuple(block_hashes[(i + 1) * ratio - 1] for i in range(len(block_hashes) // ratio))


def cache_full_blocks_rejection(
    state: PoolView,
    block_hashes: Sequence[bytes],
    block_ids: Sequence[int],
    num_cached: object,
    num_full: object,
    block_size: object,
    group_id: object,
    mask: tuple[bool, ...] | None,
) -> KvPoolError | None:
    if not state.enable_caching:
        return CachingDisabled("cache_full_blocks on a pool with caching disabled")
    error = bad_group_id(group_id)
    if error:
        return error
    if not is_count(num_cached) or not is_count(num_full):
        return InvalidArgument(
            f"num_cached_blocks {num_cached!r} and num_full_blocks {num_full!r} "
            "must be non-negative ints"
        )
    if num_cached >= num_full:
        return None  # a silent no-op in vLLM; nothing else is read
    error = bad_block_size(state, block_size)
    if error:
        return error
    assert isinstance(block_size, int)
    if num_full > len(block_ids):
        return InvalidArgument(f"num_full_blocks {num_full} > {len(block_ids)} blocks given")
    if mask is not None and len(mask) != num_full - num_cached:
        return InvalidArgument(
            f"block_mask has {len(mask)} entries for {num_full - num_cached} candidates"
        )
    ratio = block_size // state.hash_block_size
    available = len(block_hashes) // ratio
    if available < num_full:
        return InvalidArgument(
            f"request has {available} block hashes at block_size {block_size}, "
            f"needs {num_full}"
        )
    candidates = block_ids[num_cached:num_full]
    error = bad_block_id(state, candidates)
    if error:
        return error
    seen: set[int] = set()
    for i, b in enumerate(candidates):
        if b == NULL_BLOCK_ID or (mask is not None and not mask[i]):
            continue  # skipped, never keyed
        k = num_cached + i
        if b in seen:
            return InvalidArgument(f"block {b} appears twice among the blocks to cache")
        seen.add(b)
        if state.ref_cnt[b] == 0:
            return HashStateError(f"cannot cache free block {b} (ref_cnt 0)")
        tokens = state.primary_tokens[b]
        if tokens is not None and tokens >= (k + 1) * block_size:
            return HashStateError(
                f"block {b} already carries a key covering {tokens} tokens "
                f"(caching it at position {k} would cover {(k + 1) * block_size})"
            )
    return None


def cache_partial_block_rejection(
    state: PoolView,
    block_hashes: Sequence[bytes],
    block_id: int,
    num_tokens: object,
    group_id: object,
    block_size: object,
) -> KvPoolError | None:
    if not state.enable_caching:
        return CachingDisabled("cache_partial_block on a pool with caching disabled")
    error = bad_block_id(state, (block_id,))
    if error or block_id == NULL_BLOCK_ID:
        return error  # the null block is a silent no-op (returns None)
    error = bad_group_id(group_id) or bad_block_size(state, block_size)
    if error:
        return error
    hbs = state.hash_block_size
    if not is_count(num_tokens) or num_tokens % hbs != 0:
        return InvalidArgument(f"num_tokens {num_tokens!r} is not a multiple of hbs {hbs}")
    if num_tokens == 0 or num_tokens // hbs > len(block_hashes):
        return InvalidArgument(
            f"num_tokens {num_tokens} needs {num_tokens // hbs} block hashes; "
            f"the request has {len(block_hashes)}"
        )
    if state.ref_cnt[block_id] == 0:
        return HashStateError(f"cannot cache free block {block_id} (ref_cnt 0)")
    return None


def move_block_hashes_rejection(state: PoolView, src: int, dst: int) -> KvPoolError | None:
    if not state.enable_caching:
        return CachingDisabled("move_block_hashes on a pool with caching disabled")
    error = bad_block_id(state, (src, dst))
    if error:
        return error
    if NULL_BLOCK_ID in (src, dst):
        return NullBlockMisuse(f"move_block_hashes({src}, {dst}) involves the null block")
    if src == dst:
        return InvalidArgument(f"move_block_hashes source and destination are both {src}")
    if keys_of_block(state, dst):
        return HashStateError(f"destination block {dst} already has a cache key")
    for b in (src, dst):
        if state.ref_cnt[b] == 0:
            return HashStateError(f"move_block_hashes on free block {b} (ref_cnt 0)")
    return None


def is_block_writable_rejection(state: PoolView, block_id: int) -> KvPoolError | None:
    return bad_block_id(state, (block_id,))


def evict_blocks_rejection(state: PoolView, block_ids: Sequence[int]) -> KvPoolError | None:
    return bad_block_id(state, block_ids)


def emit_cached_block_events_rejection(
    state: PoolView,
    block_hashes: Sequence[bytes],
    num_cached: object,
    block_size: object,
    group_id: object,
) -> KvPoolError | None:
    error = bad_group_id(group_id) or bad_block_size(state, block_size)
    if error:
        return error
    assert isinstance(block_size, int)
    if not is_count(num_cached):
        return InvalidArgument(f"num_cached_blocks must be a non-negative int, got {num_cached!r}")
    available = len(block_hashes) // (block_size // state.hash_block_size)
    if num_cached > available:
        return InvalidArgument(
            f"request has {available} block hashes at block_size {block_size}, "
            f"needs {num_cached}"
        )
    return None
