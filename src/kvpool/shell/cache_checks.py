"""The checks of a cache write that come before its blocks' state is read.

Spec order (:mod:`kvpool.spec.preconditions`): the call's own arguments, then the types of
the hashes it reads, then — with events on — what building its ``BlockStored`` needs from the
request; only then the blocks. The shell runs these before a core moves, and the batch checks
(:mod:`kvpool.batch.checks`) run the same functions for the cache writes of a composition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.errors import CachingDisabled, InvalidArgument, KvPoolError
from kvpool.events import EventBuilder, EventContext, stored_rejection
from kvpool.shell.dims import hbs_dims
from kvpool.spec import preconditions as pre


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
    error = pre.bad_block_size(hbs_dims(hash_block_size), block_size)  # type: ignore[arg-type]
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


def cache_write_ratio(enable_caching: bool, hash_block_size: int, hashes: Sequence[object],
                      table_len: int, num_cached: object, num_full: object, block_size: object,
                      group_id: object, mask: Sequence[bool] | None) -> int | None:
    """Hash blocks per block of a cache write whose own arguments pass and that writes
    something; ``None`` otherwise (then the core raises, or there is nothing to check)."""
    if cache_arguments_rejection(
        enable_caching, hash_block_size, len(hashes), table_len, num_cached, num_full,
        block_size, group_id, mask,
    ) is not None or num_cached >= num_full:  # type: ignore[operator]
        return None
    return block_size // hash_block_size  # type: ignore[operator]


def hashes_rejection(enable_caching: bool, hash_block_size: int, hashes: Sequence[object],
                     table_len: int, num_cached: object, num_full: object, block_size: object,
                     group_id: object, mask: Sequence[bool] | None) -> KvPoolError | None:
    """A hash the write reads that is not ``bytes``
    (:func:`kvpool.spec.preconditions.bad_block_hashes`), once the call's own arguments pass."""
    ratio = cache_write_ratio(enable_caching, hash_block_size, hashes, table_len, num_cached,
                              num_full, block_size, group_id, mask)
    if ratio is None:
        return None
    return pre.bad_block_hashes(hashes, num_cached, num_full, ratio)  # type: ignore[arg-type]


def reportable_rejection(ctx: EventContext, request: Any, enable_caching: bool,
                         hash_block_size: int, hashes: Sequence[object], table_len: int,
                         num_cached: object, num_full: object, block_size: object,
                         group_id: object, mask: Sequence[bool] | None,
                         build: EventBuilder | None = None) -> KvPoolError | None:
    """The error building the write's ``BlockStored`` (with the pool's ``build``) would hit
    (a request without token ids, a LoRA without a name, ...), once the arguments and the
    hashes pass: it adds errors and never reorders the spec's."""
    ratio = cache_write_ratio(enable_caching, hash_block_size, hashes, table_len, num_cached,
                              num_full, block_size, group_id, mask)
    if ratio is None:
        return None
    if pre.bad_block_hashes(hashes, num_cached, num_full, ratio) is not None:  # type: ignore[arg-type]
        return None
    return stored_rejection(request, ctx, hashes, num_cached, num_full,  # type: ignore[arg-type]
                            block_size, group_id, build)  # type: ignore[arg-type]
