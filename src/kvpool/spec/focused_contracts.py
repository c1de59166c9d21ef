"""Focused contracts: an operation's or a precondition's contract again, over a small domain.

The contracts of :mod:`kvpool.spec.contracts` and :mod:`kvpool.spec.precondition_contracts`
range over every valid state and (almost) any arguments. Some promises only show on a rare
combination of the two: the order of a batch needs two blocks that a release *empties*; the
order of eviction events needs two *keyed* blocks; a ``cache_full_blocks`` refusal of one
block at two positions needs eight arguments that pass every earlier check on one path. Within
the CI budget (10 s of CPU per operation contract, 4 s per precondition contract) the large
contracts reach these on a few paths in a thousand, or never (``python -m
kvpool.verify.selfcheck`` measures it; the table is in ``docs/contracts.md``).

Each contract here states **the same condition** as the large contract it focuses — the same
``<op>_post`` and invariants, or the same independent §12 rows
(``precondition_contracts.<op>_invalid_rows``) — over a domain named by its argument types
(:mod:`kvpool.spec.state`: ``ReleasedBatch``, ``KeyedBatch``, …). The CrossHair plugin draws
those arguments concretely from the domain (:mod:`kvpool.verify.crosshair_states`), so the
rare combination is one choice among a few; and the precondition says what the domain is, so
the contract means the same at runtime. Nothing is weakened: the large contracts stay as they
are and are checked too; these add searches.

=====================================  =====================================================
contract                               domain (beyond "a valid call")
=====================================  =====================================================
``free_blocks_releasing``              2–4 distinct held blocks, each with one reference
``unpin_blocks_releasing``             the same, for ``unpin_blocks``
``evict_blocks_keyed``                 2–4 distinct keyed blocks, events on
``get_new_blocks_evicting``            pops 2 or more blocks, two of them keyed; events on
``get_cached_block_hits``              a hash of the key alphabet, 2–4 groups among 0 and 1
``cache_full_blocks_call``             a well-formed call drawn whole (``CacheFullCall``)
``cache_full_blocks_rejection_probe``  a well-formed call with at most one part broken
``move_block_hashes_rejection_drawn``  ``src``/``dst`` drawn among the pool's ids, -1 and N
=====================================  =====================================================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import icontract

from kvpool.errors import KvPoolError
from kvpool.spec import contracts as _contracts
from kvpool.spec import ops
from kvpool.spec import preconditions as pre
from kvpool.spec.contracts import CONTRACTS, invariants_hold_before
from kvpool.spec.ops import Outcome
from kvpool.spec.precondition_contracts import (
    INVALID_ROWS,
    precondition_contract_of,
    rejects_exactly,
)
from kvpool.spec.state import (
    NULL_BLOCK_ID,
    BlockId,
    CachedHash,
    CacheFullCall,
    CacheFullProbe,
    HitGroups,
    KeyedBatch,
    PoolState,
    PopCount,
    ReleasedBatch,
)

# ---------------------------------------------------------------------------------------------
# Domains
# ---------------------------------------------------------------------------------------------


def _given(*facts: object) -> bool:
    # Looked up at call time: under CrossHair the plugin replaces contracts.given.
    return _contracts.given(*facts)


def each_released_once(state: PoolState, block_ids: tuple[int, ...]) -> bool:
    """Distinct non-null ids, each block holding exactly one reference: the release empties
    every listed block (the ref count facts are solver assumptions under CrossHair)."""
    if len(set(block_ids)) != len(block_ids) or NULL_BLOCK_ID in block_ids:
        return False
    return _given(*(state.ref_cnt[b] == 1 for b in block_ids))


def free_blocks_releasing_valid(state: PoolState, block_ids: tuple[int, ...]) -> bool:
    return each_released_once(state, block_ids) and CONTRACTS["free_blocks"][0](state, block_ids)


def unpin_blocks_releasing_valid(state: PoolState, block_ids: tuple[int, ...]) -> bool:
    return each_released_once(state, block_ids) and CONTRACTS["unpin_blocks"][0](
        state, block_ids)


def evict_blocks_keyed_valid(state: PoolState, block_ids: tuple[int, ...]) -> bool:
    return (
        state.enable_events
        and len(set(block_ids)) == len(block_ids) >= 2
        and CONTRACTS["evict_blocks"][0](state, block_ids)
        and all(state.primary_key[b] is not None for b in block_ids)
    )


def get_new_blocks_evicting_valid(state: PoolState, num_blocks: int) -> bool:
    return (
        state.enable_events
        and state.enable_caching
        and CONTRACTS["get_new_blocks"][0](state, num_blocks)
        and sum(state.primary_key[b] is not None for b in state.free_queue[:num_blocks]) >= 2
    )


def get_cached_block_hits_valid(
    state: PoolState, block_hash: bytes, group_ids: tuple[int, ...]
) -> bool:
    return len(group_ids) >= 2 and CONTRACTS["get_cached_block"][0](state, block_hash, group_ids)


# ---------------------------------------------------------------------------------------------
# Attaching the conditions
# ---------------------------------------------------------------------------------------------


def focused_contract_of(op_name: str, domain: Callable[..., bool]) -> Callable:
    """``op_name``'s operation contract with ``domain`` (which includes the argument check)
    as its argument condition: the same invariants and the same ``<op>_post``."""
    _, post = CONTRACTS[op_name]

    def decorate(fn: Callable) -> Callable:
        fn = icontract.require(invariants_hold_before, "every invariant holds before")(fn)
        fn = icontract.require(domain, "the arguments are valid and in the focused domain")(fn)
        description = f"every invariant holds after, and the exact effect of {op_name}"
        fn = icontract.ensure(_contracts.with_invariants_after(post), description)(fn)
        fn.kvpool_focuses = op_name  # type: ignore[attr-defined]
        return fn

    return decorate


def call_contract_of(op_name: str) -> Callable:
    """``op_name``'s operation contract for a wrapper ``(state, call)`` whose ``call`` holds
    the operation's other arguments as one tuple (drawn whole by the plugin)."""
    valid, post = CONTRACTS[op_name]
    params = list(inspect.signature(post).parameters)[1:-1]  # between state and result

    def arguments_valid(state: PoolState, call: tuple) -> bool:
        return len(call) == len(params) and valid(state, *call)

    def condition(state: PoolState, call: tuple, result: Outcome) -> bool:
        return _contracts.invariants_hold_after(result) and post(state, *call, result=result)

    # The signature first: inspect.signature would otherwise follow __wrapped__ to ``post``.
    condition.__signature__ = inspect.signature(condition)  # type: ignore[attr-defined]
    condition.__wrapped__ = post  # type: ignore[attr-defined]  # reports name the postcondition
    condition.__name__ = condition.__qualname__ = f"invariants_hold_after_and_{post.__name__}"

    def decorate(fn: Callable) -> Callable:
        fn = icontract.require(invariants_hold_before, "every invariant holds before")(fn)
        fn = icontract.require(arguments_valid, "the arguments are valid")(fn)
        description = f"every invariant holds after, and the exact effect of {op_name}"
        fn = icontract.ensure(condition, description)(fn)
        fn.kvpool_focuses = op_name  # type: ignore[attr-defined]
        fn.kvpool_call_tuple = True  # type: ignore[attr-defined]  # read by explain
        return fn

    return decorate


def call_precondition_contract_of(op_name: str) -> Callable:
    """``op_name``'s precondition contract (the same §12 rows) for a wrapper ``(state, call)``."""
    rows_of, _ = INVALID_ROWS[op_name]

    def rejects_exactly_the_invalid_rows(state: PoolState, call: tuple,
                                         result: KvPoolError | None) -> bool:
        return rejects_exactly(rows_of(state, *call), result)

    def decorate(fn: Callable) -> Callable:
        fn = icontract.require(invariants_hold_before, "every invariant holds before")(fn)
        fn = icontract.ensure(
            rejects_exactly_the_invalid_rows, f"{op_name}'s precondition rejects exactly its "
            "§12 rows")(fn)
        fn.kvpool_precondition_of = op_name  # type: ignore[attr-defined]  # read by explain
        fn.kvpool_call_tuple = True  # type: ignore[attr-defined]
        return fn

    return decorate


# ---------------------------------------------------------------------------------------------
# The focused contracts
# ---------------------------------------------------------------------------------------------


@focused_contract_of("free_blocks", free_blocks_releasing_valid)
def free_blocks_releasing(state: PoolState, block_ids: ReleasedBatch) -> Outcome:
    return ops.free_blocks(state, block_ids)


@focused_contract_of("unpin_blocks", unpin_blocks_releasing_valid)
def unpin_blocks_releasing(state: PoolState, block_ids: ReleasedBatch) -> Outcome:
    return ops.unpin_blocks(state, block_ids)


@focused_contract_of("evict_blocks", evict_blocks_keyed_valid)
def evict_blocks_keyed(state: PoolState, block_ids: KeyedBatch) -> Outcome:
    return ops.evict_blocks(state, block_ids)


@focused_contract_of("get_new_blocks", get_new_blocks_evicting_valid)
def get_new_blocks_evicting(state: PoolState, num_blocks: PopCount) -> Outcome:
    return ops.get_new_blocks(state, num_blocks)


@focused_contract_of("get_cached_block", get_cached_block_hits_valid)
def get_cached_block_hits(
    state: PoolState, block_hash: CachedHash, group_ids: HitGroups
) -> Outcome:
    return ops.get_cached_block(state, block_hash, group_ids)


@call_contract_of("cache_full_blocks")
def cache_full_blocks_call(state: PoolState, call: CacheFullCall) -> Outcome:
    return ops.cache_full_blocks(state, *call)


@call_precondition_contract_of("cache_full_blocks")
def cache_full_blocks_rejection_probe(
    state: PoolState, call: CacheFullProbe
) -> KvPoolError | None:
    return pre.cache_full_blocks_rejection(state, *call)


@precondition_contract_of("move_block_hashes")
def move_block_hashes_rejection_drawn(
    state: PoolState, src: BlockId, dst: BlockId
) -> KvPoolError | None:
    return pre.move_block_hashes_rejection(state, src, dst)


FOCUSED_OPERATION_CONTRACTS: tuple[str, ...] = (
    "free_blocks_releasing",
    "unpin_blocks_releasing",
    "evict_blocks_keyed",
    "get_new_blocks_evicting",
    "get_cached_block_hits",
    "cache_full_blocks_call",
)
"""Focused operation contracts (the operation-contract budget)."""

FOCUSED_PRECONDITION_CONTRACTS: tuple[str, ...] = (
    "cache_full_blocks_rejection_probe",
    "move_block_hashes_rejection_drawn",
)
"""Focused precondition contracts (the precondition-contract budget)."""

__all__ = [
    "FOCUSED_OPERATION_CONTRACTS",
    "FOCUSED_PRECONDITION_CONTRACTS",
    *FOCUSED_OPERATION_CONTRACTS,
    *FOCUSED_PRECONDITION_CONTRACTS,
]
