"""Each pool operation's contract: from any valid state and valid arguments, its exact effect.

For every operation of :mod:`kvpool.spec.ops` this module has a contracted wrapper of the same
name. Its icontract conditions say, in this order:

* require — the state satisfies every invariant (:func:`invariants_hold_before`);
* require — the arguments are valid: the operation's :mod:`~kvpool.spec.preconditions`
  function returns ``None`` (``<op>_valid``). Invalid calls are not contract violations: the
  operation raises the typed error itself, and tests check those errors;
* ensure — every invariant holds on the new state (:func:`invariants_hold_after`) *and*
  ``<op>_post(state, args..., result)`` from :mod:`~kvpool.spec.postconditions`: the
  operation's exact effect, stated the way a textbook page would (``state`` is the state
  *before* the call — states are immutable — and ``result`` the
  :class:`~kvpool.spec.ops.Outcome`). Each one also pins what must *not* change.

:data:`CONTRACTS` lists both conditions per operation; :func:`contract_of` attaches them to
any implementation (the tests attach them to deliberately broken copies).

CrossHair checks these inductively (see ``docs/contracts.md`` and
:mod:`kvpool.verify.crosshair_check`): if every operation maps every valid state to a valid
state with exactly the stated effect, every reachable state is valid. The same conditions run
at runtime whenever a wrapper is called (icontract is on unless Python runs with ``-O``).

Helpers used inside conditions carry no contracts of their own: CrossHair ignores failures
inside nested contracted calls.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

import icontract

from kvpool.keys import MAX_GROUP_ID
from kvpool.spec import ops
from kvpool.spec import preconditions as pre
from kvpool.spec.invariants import all_invariants_hold
from kvpool.spec.ops import Outcome
from kvpool.spec.postconditions import (
    cache_full_blocks_post,
    cache_partial_block_post,
    emit_cached_block_events_post,
    evict_blocks_post,
    free_blocks_post,
    get_cached_block_post,
    get_new_blocks_post,
    get_usage_post,
    is_block_writable_post,
    move_block_hashes_post,
    reset_prefix_cache_post,
    touch_post,
    unpin_blocks_post,
)
from kvpool.spec.state import NULL_BLOCK_ID, BlockIds, PoolState

F = TypeVar("F", bound=Callable)


# ---------------------------------------------------------------------------------------------
# Facts every valid call satisfies
# ---------------------------------------------------------------------------------------------


def given(*facts: object) -> bool:
    """Whether every fact holds: facts each valid call satisfies, stated before the full check.

    At runtime this is ``all(facts)``, so ``<op>_valid`` means exactly "the precondition
    function returns None". Under CrossHair the plugin (:mod:`kvpool.verify.crosshair_states`)
    turns each symbolic fact into a solver assumption instead of a branch, so the search stops
    spending most of its paths on arguments the precondition would reject anyway. Facts are
    single comparisons (``&``/``|`` to combine): a chained comparison would branch first.
    """
    return all(facts)


def ids_in_range(state: PoolState, block_ids: tuple[int, ...], low: int = 0) -> tuple:
    """The facts ``low ≤ b < num_blocks`` for every listed id."""
    return tuple(b >= low for b in block_ids) + tuple(b < state.num_blocks for b in block_ids)


def group_in_range(group_id: int) -> tuple:
    return (group_id >= 0, group_id <= MAX_GROUP_ID)


def size_is_valid(state: PoolState, block_size: int) -> bool:
    """The fact "block_size is a positive multiple of hash_block_size"."""
    return (block_size > 0) & (block_size % state.hash_block_size == 0)


# ---------------------------------------------------------------------------------------------
# Conditions shared by every operation
# ---------------------------------------------------------------------------------------------


def invariants_hold_before(state: PoolState) -> bool:
    """The state satisfies every invariant."""
    return all_invariants_hold(state)


def invariants_hold_after(result: Outcome) -> bool:
    """The new state satisfies every invariant."""
    return all_invariants_hold(result.state)


# ---------------------------------------------------------------------------------------------
# Argument validity: the precondition function says yes
# ---------------------------------------------------------------------------------------------


def get_new_blocks_valid(state: PoolState, num_blocks: int) -> bool:
    return (
        given(num_blocks >= 0, num_blocks <= len(state.free_queue))
        and pre.get_new_blocks_rejection(state, num_blocks) is None
    )


def touch_valid(state: PoolState, block_ids: tuple[int, ...]) -> bool:
    return given(*ids_in_range(state, block_ids)) and pre.touch_rejection(state, block_ids) is None


def free_blocks_valid(state: PoolState, block_ids: tuple[int, ...]) -> bool:
    return (
        given(*ids_in_range(state, block_ids))
        and pre.free_blocks_rejection(state, block_ids) is None
    )


def unpin_blocks_valid(state: PoolState, block_ids: tuple[int, ...]) -> bool:
    return (
        given(*ids_in_range(state, block_ids, low=1))
        and pre.unpin_blocks_rejection(state, block_ids) is None
    )


def get_cached_block_valid(state: PoolState, block_hash: bytes, group_ids: tuple[int, ...]) -> bool:
    facts = (len(group_ids) > 0,) + tuple(f for g in group_ids for f in group_in_range(g))
    return given(*facts) and pre.get_cached_block_rejection(state, block_hash, group_ids) is None


def cache_full_blocks_valid(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_ids: tuple[int, ...],
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    mask: tuple[bool, ...] | None,
) -> bool:
    ratio_ok = (num_cached >= num_full) | (
        size_is_valid(state, block_size) & (num_full <= len(block_ids))
    )
    return (
        given(num_cached >= 0, num_full >= 0, *group_in_range(group_id), ratio_ok)
        and pre.cache_full_blocks_rejection(
            state, block_hashes, block_ids, num_cached, num_full, block_size, group_id, mask
        )
        is None
    )


def cache_partial_block_valid(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_id: int,
    num_tokens: int,
    group_id: int,
    block_size: int,
    replace_existing: bool,
) -> bool:
    hbs = state.hash_block_size
    low, high = group_in_range(group_id)
    null_or_valid = (block_id == NULL_BLOCK_ID) | (  # the null block is a no-op, unchecked
        low
        & high
        & size_is_valid(state, block_size)
        & (num_tokens > 0)
        & (num_tokens % hbs == 0)
        & (num_tokens // hbs <= len(block_hashes))
    )
    return (
        given(*ids_in_range(state, (block_id,)), null_or_valid)
        and pre.cache_partial_block_rejection(
            state, block_hashes, block_id, num_tokens, group_id, block_size
        )
        is None
    )


def move_block_hashes_valid(state: PoolState, src: int, dst: int) -> bool:
    return (
        given(*ids_in_range(state, (src, dst), low=1), src != dst)
        and pre.move_block_hashes_rejection(state, src, dst) is None
    )


def evict_blocks_valid(state: PoolState, block_ids: tuple[int, ...]) -> bool:
    return (
        given(*ids_in_range(state, block_ids))
        and pre.evict_blocks_rejection(state, block_ids) is None
    )


def reset_prefix_cache_valid(state: PoolState) -> bool:
    return True  # a held block is a refusal (result False), not an error


def emit_cached_block_events_valid(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    num_cached: int,
    block_size: int,
    group_id: int,
) -> bool:
    return (
        given(num_cached >= 0, *group_in_range(group_id), size_is_valid(state, block_size))
        and pre.emit_cached_block_events_rejection(
            state, block_hashes, num_cached, block_size, group_id
        )
        is None
    )


def get_usage_valid(state: PoolState) -> bool:
    return True  # a query of every pool


def is_block_writable_valid(state: PoolState, block_id: int) -> bool:
    return (
        given(*ids_in_range(state, (block_id,)))
        and pre.is_block_writable_rejection(state, block_id) is None
    )


# ---------------------------------------------------------------------------------------------
# The contracts, and the contracted operations
# ---------------------------------------------------------------------------------------------


CONTRACTS: dict[str, tuple[Callable[..., bool], Callable[..., bool]]] = {
    "get_new_blocks": (get_new_blocks_valid, get_new_blocks_post),
    "touch": (touch_valid, touch_post),
    "free_blocks": (free_blocks_valid, free_blocks_post),
    "unpin_blocks": (unpin_blocks_valid, unpin_blocks_post),
    "get_cached_block": (get_cached_block_valid, get_cached_block_post),
    "cache_full_blocks": (cache_full_blocks_valid, cache_full_blocks_post),
    "cache_partial_block": (cache_partial_block_valid, cache_partial_block_post),
    "move_block_hashes": (move_block_hashes_valid, move_block_hashes_post),
    "evict_blocks": (evict_blocks_valid, evict_blocks_post),
    "reset_prefix_cache": (reset_prefix_cache_valid, reset_prefix_cache_post),
    "emit_cached_block_events": (emit_cached_block_events_valid, emit_cached_block_events_post),
    "is_block_writable": (is_block_writable_valid, is_block_writable_post),
    "get_usage": (get_usage_valid, get_usage_post),
}
"""Operation name → (argument validity, postcondition), in the order of :mod:`ops`."""


def with_invariants_after(post: Callable[..., bool]) -> Callable[..., bool]:
    """``post`` and "every invariant holds on the new state", as one condition.

    One condition, not two: CrossHair searches each postcondition separately, so a single
    conjunction checks both on every explored path for half the time.
    """

    def condition(**kwargs: object) -> bool:
        return invariants_hold_after(kwargs["result"]) and post(**kwargs)  # type: ignore[arg-type]

    # icontract (and CrossHair through it) passes arguments by the names in the signature;
    # __wrapped__ makes reports point at the postcondition's source, not at this closure.
    condition.__signature__ = inspect.signature(post)  # type: ignore[attr-defined]
    condition.__wrapped__ = post  # type: ignore[attr-defined]
    condition.__name__ = condition.__qualname__ = f"invariants_hold_after_and_{post.__name__}"
    return condition


def contract_of(op_name: str) -> Callable[[F], F]:
    """The icontract decorators of operation ``op_name``, for any implementation of it.

    icontract evaluates the innermost precondition first, so the invariants are checked
    before the argument check (which may index per-block arrays).
    """
    valid, post = CONTRACTS[op_name]

    def decorate(fn: F) -> F:
        fn = icontract.require(invariants_hold_before, "every invariant holds before")(fn)
        fn = icontract.require(valid, "the arguments are valid")(fn)
        description = f"every invariant holds after, and the exact effect of {op_name}"
        return icontract.ensure(with_invariants_after(post), description)(fn)

    return decorate


@contract_of("get_new_blocks")
def get_new_blocks(state: PoolState, num_blocks: int) -> Outcome:
    return ops.get_new_blocks(state, num_blocks)


@contract_of("touch")
def touch(state: PoolState, block_ids: BlockIds) -> Outcome:
    return ops.touch(state, block_ids)


@contract_of("free_blocks")
def free_blocks(state: PoolState, block_ids: BlockIds) -> Outcome:
    return ops.free_blocks(state, block_ids)


@contract_of("unpin_blocks")
def unpin_blocks(state: PoolState, block_ids: BlockIds) -> Outcome:
    return ops.unpin_blocks(state, block_ids)


@contract_of("get_cached_block")
def get_cached_block(state: PoolState, block_hash: bytes, group_ids: tuple[int, ...]) -> Outcome:
    return ops.get_cached_block(state, block_hash, group_ids)


@contract_of("cache_full_blocks")
def cache_full_blocks(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_ids: BlockIds,
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    mask: tuple[bool, ...] | None,
) -> Outcome:
    return ops.cache_full_blocks(
        state, block_hashes, block_ids, num_cached, num_full, block_size, group_id, mask
    )


@contract_of("cache_partial_block")
def cache_partial_block(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_id: int,
    num_tokens: int,
    group_id: int,
    block_size: int,
    replace_existing: bool,
) -> Outcome:
    return ops.cache_partial_block(
        state, block_hashes, block_id, num_tokens, group_id, block_size, replace_existing
    )


@contract_of("move_block_hashes")
def move_block_hashes(state: PoolState, src: int, dst: int) -> Outcome:
    return ops.move_block_hashes(state, src, dst)


@contract_of("evict_blocks")
def evict_blocks(state: PoolState, block_ids: BlockIds) -> Outcome:
    return ops.evict_blocks(state, block_ids)


@contract_of("reset_prefix_cache")
def reset_prefix_cache(state: PoolState) -> Outcome:
    return ops.reset_prefix_cache(state)


@contract_of("emit_cached_block_events")
def emit_cached_block_events(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    num_cached: int,
    block_size: int,
    group_id: int,
) -> Outcome:
    return ops.emit_cached_block_events(state, block_hashes, num_cached, block_size, group_id)


@contract_of("is_block_writable")
def is_block_writable(state: PoolState, block_id: int) -> Outcome:
    return ops.is_block_writable(state, block_id)


@contract_of("get_usage")
def get_usage(state: PoolState) -> Outcome:
    """``ops.get_usage`` as an outcome (the shell's usage comes from the same function)."""
    return Outcome(state, ops.get_usage(state))


__all__ = ["CONTRACTS", "contract_of", *CONTRACTS]
