"""Each pool operation's exact effect, as one named predicate per operation.

``<op>_post(state, args..., result)`` is true iff ``result`` (an :class:`~kvpool.spec.ops.Outcome`)
is exactly what operation ``op`` must do from ``state`` with those arguments: its result, the
new queue, ref counts, keys, hash table, watchers and events, stated the way a textbook page
would, plus what must *not* change. ``state`` is the state *before* the call (states are
immutable values); the parameter names follow icontract, which binds conditions by name.
:mod:`kvpool.spec.contracts` attaches them to the operations.

These are plain functions with no contracts of their own: CrossHair ignores failures inside
nested contracted calls.
"""

from __future__ import annotations

from dataclasses import fields

from kvpool.keys import pack_key
from kvpool.spec.ops import Outcome
from kvpool.spec.records import ClearedRecord, PartialStoredRecord, RemovedRecord, StoredRecord
from kvpool.spec.state import NULL_BLOCK_ID, PoolState, keys_of_block

_KEY_FIELDS = ("primary_key", "primary_tokens", "secondary_keys", "cache")
"""The state fields that hold cache identity."""


# ---------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------


def only_changed(before: PoolState, after: PoolState, *changed: str) -> bool:
    """Every field of the state except those named is equal before and after."""
    return all(
        getattr(before, f.name) == getattr(after, f.name)
        for f in fields(PoolState)
        if f.name not in changed
    )


def quiet(result: Outcome) -> bool:
    """The operation emitted no event and fired no watcher."""
    return result.events == () and result.fired_watchers == ()


def removed_records(before: PoolState, keys: tuple[bytes, ...]) -> tuple:
    """One ``RemovedRecord`` per key, numbered from the pool's event counter (none if off)."""
    if not before.enable_events:
        return ()
    return tuple(RemovedRecord(before.event_count + i, key) for i, key in enumerate(keys))


def counter_advanced(before: PoolState, result: Outcome) -> bool:
    """The event counter moved past exactly the events this call emitted."""
    return result.state.event_count == before.event_count + len(result.events)


def occurrences(block_ids: tuple[int, ...], block_id: int) -> int:
    return sum(1 for b in block_ids if b == block_id)


def first_occurrences(block_ids: tuple[int, ...]) -> tuple[int, ...]:
    """The distinct ids, in order of first appearance."""
    return tuple(b for i, b in enumerate(block_ids) if b not in block_ids[:i])


def released_counts(before: PoolState, block_ids: tuple[int, ...]) -> tuple[int, ...]:
    """Ref counts after one release per listed non-null block."""
    return tuple(
        r - occurrences(block_ids, b) if b != NULL_BLOCK_ID else r
        for b, r in enumerate(before.ref_cnt)
    )


def reached_zero(before: PoolState, block_ids: tuple[int, ...]) -> tuple[int, ...]:
    """Blocks whose count a release batch brings to 0, in the order of that last release."""
    return tuple(
        b
        for i, b in enumerate(block_ids)
        if b != NULL_BLOCK_ID and occurrences(block_ids[: i + 1], b) == before.ref_cnt[b]
    )


def keys_kept_except(before: PoolState, after: PoolState, block_ids: tuple[int, ...]) -> bool:
    """Every block not listed keeps its primary key, token count and secondary keys."""
    return all(
        before.primary_key[b] == after.primary_key[b]
        and before.primary_tokens[b] == after.primary_tokens[b]
        and before.secondary_keys.get(b, ()) == after.secondary_keys.get(b, ())
        for b in range(before.num_blocks)
        if b not in block_ids
    )


def table_without(cache: dict, block_ids: tuple[int, ...]) -> dict:
    """The hash table with every entry of the listed blocks gone (empty keys dropped)."""
    out = {}
    for key, ids in cache.items():
        rest = tuple(b for b in ids if b not in block_ids)
        if rest:
            out[key] = rest
    return out


def table_with(cache: dict, key: bytes, block_id: int) -> dict:
    """The hash table with ``block_id`` added under ``key`` as its newest entry."""
    ids = cache.get(key, ())
    if block_id in ids:
        return cache
    out = dict(cache)
    out[key] = ids + (block_id,)
    return out


def hash_at(before: PoolState, block_hashes: tuple, block_size: int, position: int) -> bytes:
    """The hash of logical block ``position`` at ``block_size``: the last fine hash inside it."""
    ratio = block_size // before.hash_block_size
    return block_hashes[(position + 1) * ratio - 1]


# ---------------------------------------------------------------------------------------------
# Allocation and release
# ---------------------------------------------------------------------------------------------


def get_new_blocks_post(state: PoolState, num_blocks: int, result: Outcome) -> bool:
    """Hands out the first n queued blocks (ref 1, no keys; their keys leave, one event each)."""
    after = result.state
    popped = state.free_queue[:num_blocks]
    evicted = tuple(k for b in popped for k in keys_of_block(state, b))
    return (
        result.result == popped
        and after.free_queue == state.free_queue[num_blocks:]
        and after.ref_cnt
        == tuple(1 if b in popped else r for b, r in enumerate(state.ref_cnt))
        and all(not keys_of_block(after, b) for b in popped)
        and keys_kept_except(state, after, popped)
        and after.cache == table_without(state.cache, popped)
        and result.fired_watchers == tuple(b for b in popped if b in state.watchers)
        and after.watchers == tuple(b for b in state.watchers if b not in popped)
        and result.events == removed_records(state, evicted)
        and counter_advanced(state, result)
        and only_changed(state, after, *_KEY_FIELDS, "ref_cnt", "free_queue", "watchers",
                         "event_count")
    )


def touch_post(state: PoolState, block_ids: tuple[int, ...], result: Outcome) -> bool:
    """One more reference per listed non-null block; queued hits leave the queue; no key moves."""
    hits = tuple(b for b in block_ids if b != NULL_BLOCK_ID)
    after = result.state
    return (
        result.result is None
        and quiet(result)
        and after.ref_cnt
        == tuple(r + occurrences(hits, b) for b, r in enumerate(state.ref_cnt))
        and after.free_queue == tuple(b for b in state.free_queue if b not in hits)
        and only_changed(state, after, "ref_cnt", "free_queue")
    )


def free_blocks_post(state: PoolState, block_ids: tuple[int, ...], result: Outcome) -> bool:
    """Counts drop; queue = (freed without key, batch order) + old queue + (freed with key)."""
    released = reached_zero(state, block_ids)
    front = tuple(
        b for b in released if state.primary_key[b] is None or not state.enable_caching
    )
    tail = tuple(b for b in released if b not in front)
    after = result.state
    return (
        result.result is None
        and quiet(result)
        and after.ref_cnt == released_counts(state, block_ids)
        and after.free_queue == front + state.free_queue + tail
        and only_changed(state, after, "ref_cnt", "free_queue")
    )


def unpin_blocks_post(state: PoolState, block_ids: tuple[int, ...], result: Outcome) -> bool:
    """Counts drop; blocks reaching 0 join the tail; new watchers join the table's end."""
    new_watchers = tuple(b for b in first_occurrences(block_ids) if b not in state.watchers)
    after = result.state
    return (
        result.result is None
        and quiet(result)
        and after.ref_cnt == released_counts(state, block_ids)
        and after.free_queue == state.free_queue + reached_zero(state, block_ids)
        and after.watchers == state.watchers + new_watchers
        and only_changed(state, after, "ref_cnt", "free_queue", "watchers")
    )


# ---------------------------------------------------------------------------------------------
# The prefix cache
# ---------------------------------------------------------------------------------------------


def get_cached_block_post(
    state: PoolState, block_hash: bytes, group_ids: tuple[int, ...], result: Outcome
) -> bool:
    """The earliest entry under each group's key, or None if any group misses; no change."""
    entries = tuple(state.cache.get(pack_key(block_hash, g), ()) for g in group_ids)
    expected = None if any(not ids for ids in entries) else tuple(ids[0] for ids in entries)
    return result.result == expected and result.state == state and quiet(result)


def cache_full_blocks_post(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_ids: tuple[int, ...],
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    mask: tuple[bool, ...] | None,
    result: Outcome,
) -> bool:
    """Position k gets key (hash[k], group) over (k+1)·bs tokens, promoted blocks lose old keys."""
    if num_cached >= num_full:
        return result.state == state and result.result is None and quiet(result)
    chosen = tuple(  # (position, block, its new key)
        (k, block_ids[k], pack_key(hash_at(state, block_hashes, block_size, k), group_id))
        for k in range(num_cached, num_full)
        if block_ids[k] != NULL_BLOCK_ID and (mask is None or mask[k - num_cached])
    )
    chosen_ids = tuple(b for _, b, _ in chosen)
    promoted_keys = tuple(key for b in chosen_ids for key in keys_of_block(state, b))
    table = table_without(state.cache, chosen_ids)
    for _, b, key in chosen:
        table = table_with(table, key, b)
    stored = StoredRecord(
        state.event_count + len(promoted_keys),
        group_id,
        block_size,
        num_cached,
        num_full,
        tuple(k for k, _, _ in chosen),
        tuple(hash_at(state, block_hashes, block_size, k) for k, _, _ in chosen),
    )
    after = result.state
    return (
        result.result is None
        and result.fired_watchers == ()
        and all(
            keys_of_block(after, b) == (key,) and after.primary_tokens[b] == (k + 1) * block_size
            for k, b, key in chosen
        )
        and keys_kept_except(state, after, chosen_ids)
        and after.cache == table
        and result.events
        == removed_records(state, promoted_keys) + ((stored,) if state.enable_events else ())
        and counter_advanced(state, result)
        and only_changed(state, after, *_KEY_FIELDS, "event_count")
    )


def cache_partial_block_post(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_id: int,
    num_tokens: int,
    group_id: int,
    block_size: int,
    replace_existing: bool,
    result: Outcome,
) -> bool:
    """The entry ending at num_tokens is on the block: a shorter primary (or any, if replacing)
    is dropped first; a longer one stays and the key joins as a secondary."""
    if block_id == NULL_BLOCK_ID:
        return result.state == state and result.result is None and quiet(result)
    block_hash = block_hashes[num_tokens // state.hash_block_size - 1]
    key = pack_key(block_hash, group_id)
    old_keys = keys_of_block(state, block_id)
    old_tokens = state.primary_tokens[block_id]
    already = key in old_keys
    regrow = replace_existing or (
        not already and old_tokens is not None and old_tokens < num_tokens
    )
    keys: tuple[bytes, ...]
    dropped: tuple[bytes, ...]
    if regrow or old_tokens is None:
        keys, tokens, dropped = (key,), num_tokens, (old_keys if regrow else ())
    elif already:
        keys, tokens, dropped = old_keys, old_tokens, ()
    else:
        keys, tokens, dropped = old_keys + (key,), old_tokens, ()
    new_entry = regrow or not already
    stored = PartialStoredRecord(
        state.event_count + len(dropped), group_id, num_tokens, block_hash
    )
    after = result.state
    return (
        result.result == key
        and result.fired_watchers == ()
        and keys_of_block(after, block_id) == keys
        and after.primary_tokens[block_id] == tokens
        and keys_kept_except(state, after, (block_id,))
        and after.cache
        == table_with(
            table_without(state.cache, (block_id,)) if dropped else state.cache, key, block_id
        )
        and result.events
        == removed_records(state, dropped)
        + ((stored,) if new_entry and state.enable_events else ())
        and counter_advanced(state, result)
        and only_changed(state, after, *_KEY_FIELDS, "event_count")
    )


def move_block_hashes_post(state: PoolState, src: int, dst: int, result: Outcome) -> bool:
    """dst takes over src's keys in order (primary with its token count) as newest duplicate."""
    moved = keys_of_block(state, src)
    table = table_without(state.cache, (src,))
    for key in moved:
        table = table_with(table, key, dst)
    after = result.state
    return (
        result.result is None
        and quiet(result)
        and keys_of_block(after, src) == ()
        and after.primary_tokens[src] is None
        and keys_of_block(after, dst) == moved
        and after.primary_tokens[dst] == state.primary_tokens[src]
        and keys_kept_except(state, after, (src, dst))
        and after.cache == table
        and only_changed(state, after, *_KEY_FIELDS)
    )


def evict_blocks_post(state: PoolState, block_ids: tuple[int, ...], result: Outcome) -> bool:
    """Listed blocks lose every key (one event each, in order); counts, queue, watchers stay."""
    dropped = tuple(k for b in first_occurrences(block_ids) for k in keys_of_block(state, b))
    after = result.state
    return (
        result.result is None
        and result.fired_watchers == ()
        and all(not keys_of_block(after, b) for b in block_ids)
        and keys_kept_except(state, after, block_ids)
        and after.cache == table_without(state.cache, block_ids)
        and result.events == removed_records(state, dropped)
        and counter_advanced(state, result)
        and only_changed(state, after, *_KEY_FIELDS, "event_count")
    )


def reset_prefix_cache_post(state: PoolState, result: Outcome) -> bool:
    """Refused (False, no change) iff a non-null block is held; else every key and watcher go."""
    if any(r > 0 for r in state.ref_cnt[1:]):
        return result == Outcome(state, False)
    after = result.state
    cleared = (ClearedRecord(state.event_count),) if state.enable_events else ()
    return (
        result.result is True
        and result.fired_watchers == state.watchers
        and after.watchers == ()
        and all(k is None for k in after.primary_key)
        and all(t is None for t in after.primary_tokens)
        and after.secondary_keys == {}
        and after.cache == {}
        and result.events == cleared
        and counter_advanced(state, result)
        and only_changed(state, after, *_KEY_FIELDS, "watchers", "event_count")
    )


def emit_cached_block_events_post(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    num_cached: int,
    block_size: int,
    group_id: int,
    result: Outcome,
) -> bool:
    """With events on and n > 0, one record of positions 0…n-1 at block_size; nothing else."""
    expected: tuple[StoredRecord, ...] = ()
    if state.enable_events and num_cached > 0:
        positions = tuple(range(num_cached))
        hashes = tuple(hash_at(state, block_hashes, block_size, k) for k in positions)
        expected = (
            StoredRecord(state.event_count, group_id, block_size, 0, num_cached, positions, hashes),
        )
    return (
        result.result is None
        and result.events == expected
        and result.fired_watchers == ()
        and counter_advanced(state, result)
        and only_changed(state, result.state, "event_count")
    )


# ---------------------------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------------------------


def is_block_writable_post(state: PoolState, block_id: int, result: Outcome) -> bool:
    """True iff the block is not null, has ref_cnt 1 and no primary key; no change."""
    expected = (
        block_id != NULL_BLOCK_ID
        and state.ref_cnt[block_id] == 1
        and state.primary_key[block_id] is None
    )
    return result.result == expected and result.state == state and quiet(result)


def get_usage_post(state: PoolState, result: Outcome) -> bool:
    """The held fraction of the N − 1 usable blocks, 1 − free/(N − 1) to the last bit, in
    [0, 1] (0 for a one-block pool); no change."""
    usable = state.num_blocks - 1
    free = len(state.free_queue)
    expected = 0 if usable == 0 else 1.0 - free / usable
    value = result.result
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == expected
        and 0.0 <= value <= 1.0
        and (usable == 0 or (value == 0.0) == (free == usable))
        and result.state == state
        and quiet(result)
    )


__all__ = [
    "get_usage_post",
    "get_new_blocks_post",
    "touch_post",
    "free_blocks_post",
    "unpin_blocks_post",
    "get_cached_block_post",
    "cache_full_blocks_post",
    "cache_partial_block_post",
    "move_block_hashes_post",
    "evict_blocks_post",
    "reset_prefix_cache_post",
    "emit_cached_block_events_post",
    "is_block_writable_post",
]
