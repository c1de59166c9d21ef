"""Contracts *on the preconditions*: each rejects exactly BEHAVIOUR.md §12's invalid set.

The operation contracts (:mod:`kvpool.spec.contracts`) assume valid arguments, so the search
never builds an invalid one and a precondition that wrongly *accepts* bad input (say, the null
block in ``unpin_blocks``) could never be found. Here each operation's §12 rows are stated a
second time, independently and declaratively, as :data:`INVALID_ROWS`: ``<op>_invalid_rows``
returns the error classes §12 prescribes for the arguments (empty: the call is valid). The
contracted wrapper ``<op>_rejection`` returns what :mod:`kvpool.spec.preconditions` says and
ensures that

* it returns ``None`` exactly when no row applies, and
* otherwise its error is an instance of one of the rows that apply (a call breaking two rows
  may report either; the precondition's fixed check order picks one).

Arguments are fully symbolic under CrossHair (no ``given`` facts), so invalid ids, counts,
groups, masks and sizes are explored as much as valid ones. ``reset_prefix_cache`` has no
invalid input and no row.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import icontract

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
from kvpool.keys import MAX_GROUP_ID
from kvpool.spec import preconditions as pre
from kvpool.spec.invariants import all_invariants_hold
from kvpool.spec.state import MAX_REF_CNT, NULL_BLOCK_ID, PoolState

Rows = tuple[type[KvPoolError], ...]

# ---------------------------------------------------------------------------------------------
# The §12 table, one function per operation, written without the preconditions' code
# ---------------------------------------------------------------------------------------------


def _out_of_range(state: PoolState, ids: tuple[int, ...]) -> bool:
    return any(not (0 <= b < state.num_blocks) for b in ids)


def _bad_group(group_id: int) -> bool:
    return isinstance(group_id, bool) or not (0 <= group_id <= MAX_GROUP_ID)


def _bad_size(state: PoolState, block_size: int) -> bool:
    return block_size <= 0 or block_size % state.hash_block_size != 0


def _released_too_often(state: PoolState, ids: tuple[int, ...]) -> bool:
    """§12 double free: some non-null block listed more times than it has references."""
    return any(b != NULL_BLOCK_ID and ids.count(b) > state.ref_cnt[b] for b in ids)


def get_new_blocks_invalid_rows(state: PoolState, num_blocks: int) -> Rows:
    if num_blocks < 0:
        return (InvalidArgument,)
    return (NoFreeBlocks,) if num_blocks > len(state.free_queue) else ()


def _referenced_too_often(state: PoolState, ids: tuple[int, ...]) -> bool:
    """kvpool's ref-count limit (docs/api.md): some non-null block would pass MAX_REF_CNT."""
    return any(b != NULL_BLOCK_ID and state.ref_cnt[b] + ids.count(b) > MAX_REF_CNT for b in ids)


def touch_invalid_rows(state: PoolState, block_ids: tuple[int, ...]) -> Rows:
    if _out_of_range(state, block_ids):
        return (InvalidBlockId,)
    return (RefCountOverflow,) if _referenced_too_often(state, block_ids) else ()


def free_blocks_invalid_rows(state: PoolState, block_ids: tuple[int, ...]) -> Rows:
    if _out_of_range(state, block_ids):
        return (InvalidBlockId,)
    return (DoubleFree,) if _released_too_often(state, block_ids) else ()


def unpin_blocks_invalid_rows(state: PoolState, block_ids: tuple[int, ...]) -> Rows:
    if _out_of_range(state, block_ids):
        return (InvalidBlockId,)
    rows: Rows = (NullBlockMisuse,) if NULL_BLOCK_ID in block_ids else ()
    return rows + ((DoubleFree,) if _released_too_often(state, block_ids) else ())


def get_cached_block_invalid_rows(
    state: PoolState, block_hash: bytes, group_ids: tuple[int, ...]
) -> Rows:
    if not group_ids:
        return (InvalidArgument,)
    return (InvalidGroupId,) if any(_bad_group(g) for g in group_ids) else ()


def cache_full_blocks_invalid_rows(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_ids: tuple[int, ...],
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    mask: tuple[bool, ...] | None,
) -> Rows:
    if not state.enable_caching:
        return (CachingDisabled,)
    if _bad_group(group_id):
        return (InvalidGroupId,)
    if num_cached < 0 or num_full < 0:
        return (InvalidArgument,)
    if num_cached >= num_full:
        return ()  # vLLM's silent no-op: nothing else is read
    if (
        _bad_size(state, block_size)
        or num_full > len(block_ids)
        or (mask is not None and len(mask) != num_full - num_cached)
        or len(block_hashes) // (block_size // state.hash_block_size) < num_full
    ):
        return (InvalidArgument,)
    candidates = block_ids[num_cached:num_full]
    if _out_of_range(state, candidates):
        return (InvalidBlockId,)
    keyed = [
        (num_cached + i, b)
        for i, b in enumerate(candidates)
        if b != NULL_BLOCK_ID and (mask is None or mask[i])
    ]
    rows: Rows = ()
    if len({b for _, b in keyed}) != len(keyed):
        rows += (InvalidArgument,)  # one block cached at two positions
    if any(
        state.ref_cnt[b] == 0
        or ((tokens := state.primary_tokens[b]) is not None and tokens >= (k + 1) * block_size)
        for k, b in keyed
    ):
        rows += (HashStateError,)  # a free block, or one already keyed that far
    return rows


def cache_partial_block_invalid_rows(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_id: int,
    num_tokens: int,
    group_id: int,
    block_size: int,
) -> Rows:
    if not state.enable_caching:
        return (CachingDisabled,)
    if _out_of_range(state, (block_id,)):
        return (InvalidBlockId,)
    if block_id == NULL_BLOCK_ID:
        return ()  # a silent no-op
    if _bad_group(group_id):
        return (InvalidGroupId,)
    hbs = state.hash_block_size
    if (
        _bad_size(state, block_size)
        or num_tokens <= 0
        or num_tokens % hbs != 0
        or num_tokens // hbs > len(block_hashes)
    ):
        return (InvalidArgument,)
    return (HashStateError,) if state.ref_cnt[block_id] == 0 else ()


def move_block_hashes_invalid_rows(state: PoolState, src: int, dst: int) -> Rows:
    if not state.enable_caching:
        return (CachingDisabled,)
    if _out_of_range(state, (src, dst)):
        return (InvalidBlockId,)
    if NULL_BLOCK_ID in (src, dst):
        return (NullBlockMisuse,)
    if src == dst:
        return (InvalidArgument,)
    dst_keyed = state.primary_key[dst] is not None or bool(state.secondary_keys.get(dst))
    free = state.ref_cnt[src] == 0 or state.ref_cnt[dst] == 0
    return (HashStateError,) if dst_keyed or free else ()


def evict_blocks_invalid_rows(state: PoolState, block_ids: tuple[int, ...]) -> Rows:
    return (InvalidBlockId,) if _out_of_range(state, block_ids) else ()


def emit_cached_block_events_invalid_rows(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    num_cached: int,
    block_size: int,
    group_id: int,
) -> Rows:
    if _bad_group(group_id):
        return (InvalidGroupId,)
    if _bad_size(state, block_size) or num_cached < 0:
        return (InvalidArgument,)
    available = len(block_hashes) // (block_size // state.hash_block_size)
    return (InvalidArgument,) if num_cached > available else ()


def is_block_writable_invalid_rows(state: PoolState, block_id: int) -> Rows:
    return (InvalidBlockId,) if _out_of_range(state, (block_id,)) else ()


INVALID_ROWS: dict[str, tuple[Callable[..., Rows], Callable[..., KvPoolError | None]]] = {
    "get_new_blocks": (get_new_blocks_invalid_rows, pre.get_new_blocks_rejection),
    "touch": (touch_invalid_rows, pre.touch_rejection),
    "free_blocks": (free_blocks_invalid_rows, pre.free_blocks_rejection),
    "unpin_blocks": (unpin_blocks_invalid_rows, pre.unpin_blocks_rejection),
    "get_cached_block": (get_cached_block_invalid_rows, pre.get_cached_block_rejection),
    "cache_full_blocks": (cache_full_blocks_invalid_rows, pre.cache_full_blocks_rejection),
    "cache_partial_block": (cache_partial_block_invalid_rows, pre.cache_partial_block_rejection),
    "move_block_hashes": (move_block_hashes_invalid_rows, pre.move_block_hashes_rejection),
    "evict_blocks": (evict_blocks_invalid_rows, pre.evict_blocks_rejection),
    "emit_cached_block_events": (
        emit_cached_block_events_invalid_rows,
        pre.emit_cached_block_events_rejection,
    ),
    "is_block_writable": (is_block_writable_invalid_rows, pre.is_block_writable_rejection),
}
"""Operation → (its §12 rows, its precondition function), in the order of :mod:`ops`."""


def invariants_hold_before(state: PoolState) -> bool:
    """The state satisfies every invariant (preconditions are only asked about such states)."""
    return all_invariants_hold(state)


def rejects_exactly(rows: Rows, result: KvPoolError | None) -> bool:
    """None iff no row applies; else an error of one of the applicable rows."""
    if not rows:
        return result is None
    return result is not None and isinstance(result, rows)


def precondition_contract_of(op_name: str) -> Callable:
    """The icontract decorators saying ``op_name``'s precondition matches its §12 rows."""
    rows_of, _ = INVALID_ROWS[op_name]

    def decorate(fn: Callable) -> Callable:
        params = list(inspect.signature(fn).parameters.values())
        signature = inspect.Signature(
            params + [inspect.Parameter("result", inspect.Parameter.KEYWORD_ONLY)]
        )

        def rejects_exactly_the_invalid_rows(**kwargs: object) -> bool:
            result = kwargs.pop("result")
            return rejects_exactly(rows_of(**kwargs), result)  # type: ignore[arg-type]

        condition = rejects_exactly_the_invalid_rows
        condition.__signature__ = signature  # type: ignore[attr-defined]
        fn = icontract.require(invariants_hold_before, "every invariant holds before")(fn)
        fn = icontract.ensure(
            condition, f"{op_name}'s precondition rejects exactly its §12 rows"
        )(fn)
        fn.kvpool_precondition_of = op_name  # type: ignore[attr-defined]  # read by explain
        return fn

    return decorate


@precondition_contract_of("get_new_blocks")
def get_new_blocks_rejection(state: PoolState, num_blocks: int) -> KvPoolError | None:
    return pre.get_new_blocks_rejection(state, num_blocks)


@precondition_contract_of("touch")
def touch_rejection(state: PoolState, block_ids: tuple[int, ...]) -> KvPoolError | None:
    return pre.touch_rejection(state, block_ids)


@precondition_contract_of("free_blocks")
def free_blocks_rejection(state: PoolState, block_ids: tuple[int, ...]) -> KvPoolError | None:
    return pre.free_blocks_rejection(state, block_ids)


@precondition_contract_of("unpin_blocks")
def unpin_blocks_rejection(state: PoolState, block_ids: tuple[int, ...]) -> KvPoolError | None:
    return pre.unpin_blocks_rejection(state, block_ids)


@precondition_contract_of("get_cached_block")
def get_cached_block_rejection(
    state: PoolState, block_hash: bytes, group_ids: tuple[int, ...]
) -> KvPoolError | None:
    return pre.get_cached_block_rejection(state, block_hash, group_ids)


@precondition_contract_of("cache_full_blocks")
def cache_full_blocks_rejection(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_ids: tuple[int, ...],
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    mask: tuple[bool, ...] | None,
) -> KvPoolError | None:
    return pre.cache_full_blocks_rejection(
        state, block_hashes, block_ids, num_cached, num_full, block_size, group_id, mask
    )


@precondition_contract_of("cache_partial_block")
def cache_partial_block_rejection(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_id: int,
    num_tokens: int,
    group_id: int,
    block_size: int,
) -> KvPoolError | None:
    return pre.cache_partial_block_rejection(
        state, block_hashes, block_id, num_tokens, group_id, block_size
    )


@precondition_contract_of("move_block_hashes")
def move_block_hashes_rejection(state: PoolState, src: int, dst: int) -> KvPoolError | None:
    return pre.move_block_hashes_rejection(state, src, dst)


@precondition_contract_of("evict_blocks")
def evict_blocks_rejection(state: PoolState, block_ids: tuple[int, ...]) -> KvPoolError | None:
    return pre.evict_blocks_rejection(state, block_ids)


@precondition_contract_of("emit_cached_block_events")
def emit_cached_block_events_rejection(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    num_cached: int,
    block_size: int,
    group_id: int,
) -> KvPoolError | None:
    return pre.emit_cached_block_events_rejection(
        state, block_hashes, num_cached, block_size, group_id
    )


@precondition_contract_of("is_block_writable")
def is_block_writable_rejection(state: PoolState, block_id: int) -> KvPoolError | None:
    return pre.is_block_writable_rejection(state, block_id)


PRECONDITION_CONTRACTS: tuple[str, ...] = tuple(f"{op}_rejection" for op in INVALID_ROWS)
"""The contracted precondition wrappers of this module, one per operation."""

__all__ = [
    "INVALID_ROWS",
    "PRECONDITION_CONTRACTS",
    "precondition_contract_of",
    "rejects_exactly",
    *PRECONDITION_CONTRACTS,
    *(f"{op}_invalid_rows" for op in INVALID_ROWS),
]
