"""The pool's invariants, one named predicate each (BEHAVIOUR.md §11, pool part).

Each predicate returns the *witnesses* that break it (block ids, keys, ...): an empty tuple
means the invariant holds. The registry :data:`INVARIANTS` keeps them in checklist order so a
failed check reports which claims broke, and on what. Invariants about managers and requests
(§11.21-27) live with the policy layer; operation-level claims (§11.8, 13-19) are the
operations' postconditions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvpool.spec.state import NULL_BLOCK_ID, PoolState


def block_arrays_cover_every_id(state: PoolState) -> tuple:
    """§11.1 Every per-block array has exactly ``num_blocks`` entries, ids ``0…N-1``.

    Why: block tables are append-only, so ids are assigned once and never renumbered.
    (Also ``hash_block_size ≥ 1``: the other predicates divide by it.)
    """
    n = state.num_blocks
    arrays = {
        "ref_cnt": state.ref_cnt,
        "primary_key": state.primary_key,
        "primary_tokens": state.primary_tokens,
    }
    bad = tuple(name for name, values in arrays.items() if len(values) != n)
    bad += ("num_blocks",) if n < 1 else ()
    # CrossHair found hbs = 0 passing every invariant (and crashing §11.12 once a key exists).
    return bad + (("hash_block_size",) if state.hash_block_size < 1 else ())


def null_block_is_inert(state: PoolState) -> tuple:
    """§11.2-3 Block 0 is never queued, never keyed, never watched; its ref_cnt stays 0.

    Why: the null block is a placeholder in block tables; handing it out would alias data.
    """
    bad = []
    if NULL_BLOCK_ID in state.free_queue:
        bad.append("queued")
    if state.primary_key[NULL_BLOCK_ID] is not None or NULL_BLOCK_ID in state.secondary_keys:
        bad.append("keyed")
    if NULL_BLOCK_ID in state.watchers:
        bad.append("watched")
    if state.ref_cnt[NULL_BLOCK_ID] != 0:
        bad.append("ref_cnt")
    return tuple(bad)


def ref_counts_are_non_negative(state: PoolState) -> tuple:
    """§11.4 Every block has ``ref_cnt ≥ 0``.

    Why: a negative count is a double free that vLLM lets through silently.
    """
    return tuple(b for b, r in enumerate(state.ref_cnt) if r < 0)


def queue_holds_valid_distinct_ids(state: PoolState) -> tuple:
    """§11.6-7 The queue holds valid block ids, each at most once.

    Why: ``num_free_blocks`` is the queue length; a duplicate would be a phantom free block.
    """
    seen: set[int] = set()
    bad = []
    for b in state.free_queue:
        if not (0 <= b < state.num_blocks) or b in seen:
            bad.append(b)
        seen.add(b)
    return tuple(bad)


def queued_iff_unreferenced(state: PoolState) -> tuple:
    """§11.5 A non-null block is in the free queue ⇔ its ref_cnt is 0.

    Why: allocation pops the queue; a held block there could be handed out twice.
    """
    queued = set(state.free_queue)
    return tuple(
        b
        for b in range(1, len(state.ref_cnt))
        if (b in queued) != (state.ref_cnt[b] == 0)
    )


def primary_key_iff_in_table(state: PoolState) -> tuple:
    """§11.9 A block has a primary key ⇔ the table holds (primary, block id).

    Why: lookups go through the table and eviction through the block; they must agree.
    """
    return tuple(
        b
        for b, key in enumerate(state.primary_key)
        if key is not None and b not in state.cache.get(key, ())
    )


def secondary_keys_need_a_primary(state: PoolState) -> tuple:
    """§11.10 A block with secondary keys has a primary; each secondary maps to the block.

    Why: eviction starts from the primary; an orphan secondary would never be removed.
    """
    bad = []
    for b, keys in state.secondary_keys.items():
        if not (0 <= b < state.num_blocks) or state.primary_key[b] is None or not keys:
            bad.append(b)
            continue
        if len(set(keys)) != len(keys) or state.primary_key[b] in keys:
            bad.append(b)
            continue
        if any(b not in state.cache.get(k, ()) for k in keys):
            bad.append(b)
    return tuple(bad)


def table_entries_belong_to_their_blocks(state: PoolState) -> tuple:
    """§11.11 Every (key, block) pair in the table is that block's primary or a secondary.

    Why: a stale entry would let a lookup return a block whose content has been overwritten.
    """
    bad = []
    for key, ids in state.cache.items():
        if not ids or len(set(ids)) != len(ids):
            bad.append(key)
            continue
        for b in ids:
            if not (0 <= b < state.num_blocks):
                bad.append(key)
            elif state.primary_key[b] != key and key not in state.secondary_keys.get(b, ()):
                bad.append(key)
    return tuple(bad)


def primary_tokens_are_hash_block_multiples(state: PoolState) -> tuple:
    """§11.12 A primary key's token count is a positive multiple of ``hash_block_size``.

    Why: keys are chained hashes over whole hbs-token chunks; no other boundary exists.
    """
    hbs = state.hash_block_size
    return tuple(
        b
        # strict=False: unequal lengths are block_arrays_cover_every_id's finding, not a crash
        for b, (key, tokens) in enumerate(
            zip(state.primary_key, state.primary_tokens, strict=False)
        )
        if (key is None) != (tokens is None)
        or (tokens is not None and (tokens <= 0 or tokens % hbs != 0))
    )


def uncached_pool_has_no_keys(state: PoolState) -> tuple:
    """§12 With caching disabled no block carries a key.

    Why: kvpool rejects cache writes on such a pool, so keys can never survive allocation.
    """
    if state.enable_caching:
        return ()
    return tuple(b for b, key in enumerate(state.primary_key) if key is not None)


def watchers_are_distinct_real_blocks(state: PoolState) -> tuple:
    """§11.17 Each pending reuse watcher names one distinct non-null block.

    Why: a watcher fires at most once, when its block is reallocated.
    """
    seen: set[int] = set()
    bad = []
    for b in state.watchers:
        if not (0 < b < state.num_blocks) or b in seen:
            bad.append(b)
        seen.add(b)
    return tuple(bad)


def events_only_when_enabled(state: PoolState) -> tuple:
    """§11.19 The event counter is non-negative and stays 0 while events are disabled.

    Why: sequence numbers have no gaps, so a consumer can tell it missed nothing.
    """
    if state.event_count < 0 or (not state.enable_events and state.event_count != 0):
        return (state.event_count,)
    return ()


@dataclass(frozen=True)
class Invariant:
    """One named claim about every reachable pool state."""

    name: str
    find_violations: Callable[[PoolState], tuple]

    @property
    def why(self) -> str:
        return (self.find_violations.__doc__ or "").strip()


INVARIANTS: tuple[Invariant, ...] = tuple(
    Invariant(fn.__name__, fn)
    for fn in (
        block_arrays_cover_every_id,
        null_block_is_inert,
        ref_counts_are_non_negative,
        queue_holds_valid_distinct_ids,
        queued_iff_unreferenced,
        primary_key_iff_in_table,
        secondary_keys_need_a_primary,
        table_entries_belong_to_their_blocks,
        primary_tokens_are_hash_block_multiples,
        uncached_pool_has_no_keys,
        watchers_are_distinct_real_blocks,
        events_only_when_enabled,
    )
)


def violated_invariants(state: PoolState) -> list[tuple[str, tuple]]:
    """``[(invariant name, witnesses)]`` for every invariant ``state`` breaks, in order."""
    if block_arrays_cover_every_id(state):
        # The other predicates index the per-block arrays; a shape error must stop here.
        return [("block_arrays_cover_every_id", block_arrays_cover_every_id(state))]
    return [(inv.name, w) for inv in INVARIANTS if (w := inv.find_violations(state))]


def all_invariants_hold(state: PoolState) -> bool:
    """Whether ``state`` satisfies every invariant (the CrossHair precondition)."""
    return not violated_invariants(state)
