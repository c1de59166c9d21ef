"""The pool operations as pure functions: ``op(state, *args) -> Outcome`` (BEHAVIOUR.md §6).

Each operation first asks :mod:`kvpool.spec.preconditions` whether the arguments are valid
and raises the typed error if not; the state is immutable, so a rejected call changes nothing
by construction. Otherwise it returns the new state, the result, the events it emitted (with
sequence numbers) and the blocks whose reuse watchers fire, in firing order. Metrics calls
are a function of arguments and results, so :mod:`kvpool.shell` derives them.

Block ids arrive as tuples of ints; foreign blocks (owned by another pool) have already been
split off by the shell.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from kvpool.keys import pack_key
from kvpool.spec import free_queue, hash_map
from kvpool.spec import preconditions as pre
from kvpool.spec.records import (
    ClearedRecord,
    EventRecord,
    PartialStoredRecord,
    RemovedRecord,
    StoredRecord,
)
from kvpool.spec.state import NULL_BLOCK_ID, PoolState, keys_of_block


class Outcome(NamedTuple):
    """What one operation did."""

    state: PoolState
    result: object = None
    events: tuple[EventRecord, ...] = ()
    fired_watchers: tuple[int, ...] = ()


def _raise_if(error: Exception | None) -> None:
    if error is not None:
        raise error


class _EventSink:
    """Numbers the events of one operation, continuing the pool's sequence."""

    def __init__(self, state: PoolState) -> None:
        self.enabled = state.enable_events
        self.next_seq = state.event_count
        self.records: list[EventRecord] = []

    def removed(self, keys: tuple[bytes, ...]) -> None:
        for key in keys:
            self._add(RemovedRecord(self.next_seq, key))

    def _add(self, record: EventRecord) -> None:
        if self.enabled:
            self.records.append(record)
            self.next_seq += 1

    def add(self, make) -> None:  # make: seq -> record, built only when events are on
        if self.enabled:
            self._add(make(self.next_seq))

    def finish(self, state: PoolState) -> tuple[PoolState, tuple[EventRecord, ...]]:
        return replace(state, event_count=self.next_seq), tuple(self.records)


# ---------------------------------------------------------------------------------------------
# Allocation and release
# ---------------------------------------------------------------------------------------------


def get_new_blocks(state: PoolState, num_blocks: int) -> Outcome:
    """Pop ``num_blocks`` blocks off the front of the free queue and hand them out. O(n).

    Watchers of popped blocks fire (in pop order). With caching on, each popped block loses
    every key (one ``BlockRemoved`` per key: eviction is lazy, it happens here). Each block
    leaves with ref_cnt 1 and no key. Result: the ids, in queue order.
    """
    _raise_if(pre.get_new_blocks_rejection(state, num_blocks))
    popped, rest = free_queue.popleft_n(state.free_queue, num_blocks)
    fired = tuple(b for b in popped if b in state.watchers)
    state = replace(
        state,
        free_queue=rest,
        watchers=tuple(b for b in state.watchers if b not in popped),
    )
    events = _EventSink(state)
    ref_cnt = list(state.ref_cnt)
    for b in popped:
        if state.enable_caching:
            state, removed = hash_map.remove_all_keys(state, b)
            events.removed(removed)
        ref_cnt[b] = 1
    state, records = events.finish(replace(state, ref_cnt=tuple(ref_cnt)))
    return Outcome(state, popped, records, fired)


def touch(state: PoolState, block_ids: tuple[int, ...]) -> Outcome:
    """Take one more reference on each block (a prefix hit). O(len).

    A block with ref 0 is pulled out of the free queue first, so it cannot be evicted. The
    null block is skipped. No events, keys unchanged.
    """
    _raise_if(pre.touch_rejection(state, block_ids))
    ref_cnt = list(state.ref_cnt)
    queue = state.free_queue
    for b in block_ids:
        if b == NULL_BLOCK_ID:
            continue
        if ref_cnt[b] == 0:
            queue = free_queue.remove(queue, b)
        ref_cnt[b] += 1
    return Outcome(replace(state, ref_cnt=tuple(ref_cnt), free_queue=queue))


def free_blocks(state: PoolState, block_ids: tuple[int, ...]) -> Outcome:
    """Drop one reference per listed block; blocks reaching 0 return to the free queue. O(len).

    The caller lists blocks in eviction priority (first = evict first). Blocks without a
    primary key (or any block when caching is off) go to the *front*, in batch order: they
    can never be hit, so they are reused first (LIFO across calls, good for locality). Keyed
    blocks go to the *tail*, in batch order: the hashed zone is an LRU list.
    """
    _raise_if(pre.free_blocks_rejection(state, block_ids))
    ref_cnt = list(state.ref_cnt)
    to_front: list[int] = []
    to_tail: list[int] = []
    for b in block_ids:
        if b == NULL_BLOCK_ID:
            continue
        ref_cnt[b] -= 1
        if ref_cnt[b] == 0:
            uncached = state.primary_key[b] is None or not state.enable_caching
            (to_front if uncached else to_tail).append(b)
    queue = free_queue.prepend_n(state.free_queue, tuple(to_front))
    queue = free_queue.append_n(queue, tuple(to_tail))
    return Outcome(replace(state, ref_cnt=tuple(ref_cnt), free_queue=queue))


def unpin_blocks(state: PoolState, block_ids: tuple[int, ...]) -> Outcome:
    """Release references to blocks that stay readable until reallocated. O(len).

    Each listed block gets (or keeps) a reuse watcher; a block keeps its place in the watcher
    table when it already had one. Blocks reaching ref 0 go to the *tail* whatever their keys:
    they are last-resort eviction candidates.
    """
    _raise_if(pre.unpin_blocks_rejection(state, block_ids))
    ref_cnt = list(state.ref_cnt)
    watchers = state.watchers
    released: list[int] = []
    for b in block_ids:
        ref_cnt[b] -= 1
        if b not in watchers:
            watchers = watchers + (b,)
        if ref_cnt[b] == 0:
            released.append(b)
    queue = free_queue.append_n(state.free_queue, tuple(released))
    return Outcome(replace(state, ref_cnt=tuple(ref_cnt), free_queue=queue, watchers=watchers))


# ---------------------------------------------------------------------------------------------
# The prefix cache
# ---------------------------------------------------------------------------------------------


def get_cached_block(state: PoolState, block_hash: bytes, group_ids: tuple[int, ...]) -> Outcome:
    """One cached block per group for ``block_hash``, or ``None`` if any group misses. Pure.

    Under a key holding several blocks, the earliest inserted one answers.
    """
    _raise_if(pre.get_cached_block_rejection(state, block_hash, group_ids))
    hits = []
    for g in group_ids:
        b = hash_map.get_one_block(state.cache, pack_key(block_hash, g))
        if b is None:
            return Outcome(state, None)
        hits.append(b)
    return Outcome(state, tuple(hits))


def cache_full_blocks(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_ids: tuple[int, ...],
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    mask: tuple[bool, ...] | None = None,
) -> Outcome:
    """Give positions ``[num_cached, num_full)`` of a block table their prefix-cache keys.

    Position ``k`` gets key ``(hash[k] at block_size granularity, group_id)`` covering
    ``(k+1)·block_size`` tokens; null and masked-out blocks are skipped. A block that already
    has a (shorter, partial) key is promoted: its old keys go first, each with a
    ``BlockRemoved``. Equal keys on other blocks stay (duplicates). With events on, one
    ``BlockStored`` for the call, after the removals — even when every block was skipped.
    """
    _raise_if(
        pre.cache_full_blocks_rejection(
            state, block_hashes, block_ids, num_cached, num_full, block_size, group_id, mask
        )
    )
    if num_cached >= num_full:
        return Outcome(state)
    hashes = pre.hashes_at_block_size(state, block_hashes, block_size)
    events = _EventSink(state)
    positions: list[int] = []
    for i, b in enumerate(block_ids[num_cached:num_full]):
        if b == NULL_BLOCK_ID or (mask is not None and not mask[i]):
            continue
        k = num_cached + i
        if state.primary_key[b] is not None:
            state, removed = hash_map.remove_all_keys(state, b)
            events.removed(removed)
        state = hash_map.insert_key_on_block(
            state, pack_key(hashes[k], group_id), b, (k + 1) * block_size
        )
        positions.append(k)
    events.add(
        lambda seq: StoredRecord(
            seq,
            group_id,
            block_size,
            num_cached,
            num_full,
            tuple(positions),
            tuple(hashes[k] for k in positions),
        )
    )
    state, records = events.finish(state)
    return Outcome(state, None, records)


def cache_partial_block(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_id: int,
    num_tokens: int,
    group_id: int,
    block_size: int,
    replace_existing: bool = False,
) -> Outcome:
    """Register a prefix entry ending ``num_tokens`` into the sequence, inside ``block_id``.

    Result: the key, or ``None`` for the null block. The entry "grows": if the block's primary
    covers fewer tokens, its old keys go (``BlockRemoved`` each) and the new key becomes the
    primary; if the primary covers more, the new key becomes a secondary. With
    ``replace_existing`` every old key goes first. One ``BlockStored`` per *new* entry.
    """
    _raise_if(
        pre.cache_partial_block_rejection(
            state, block_hashes, block_id, num_tokens, group_id, block_size
        )
    )
    if block_id == NULL_BLOCK_ID:
        return Outcome(state, None)
    block_hash = block_hashes[num_tokens // state.hash_block_size - 1]
    key = pack_key(block_hash, group_id)
    already = state.primary_key[block_id] == key or block_id in state.cache.get(key, ())
    events = _EventSink(state)
    primary_tokens = state.primary_tokens[block_id]
    if replace_existing or (
        not already and primary_tokens is not None and primary_tokens < num_tokens
    ):
        state, removed = hash_map.remove_all_keys(state, block_id)
        events.removed(removed)
        already = False
    state = hash_map.insert_key_on_block(state, key, block_id, num_tokens)
    if not already:
        events.add(lambda seq: PartialStoredRecord(seq, group_id, num_tokens, block_hash))
    state, records = events.finish(state)
    return Outcome(state, key, records)


def move_block_hashes(state: PoolState, src: int, dst: int) -> Outcome:
    """Hand every key of ``src`` to ``dst`` (a private copy takes over the cache identity).

    Keys move in order — primary first, keeping its token count, then the secondaries — and
    ``dst`` becomes the newest duplicate under each. Entries stay live: no events.
    """
    _raise_if(pre.move_block_hashes_rejection(state, src, dst))
    tokens = state.primary_tokens[src]
    state, moved = hash_map.remove_all_keys(state, src)
    for key in moved:
        assert tokens is not None  # a block with keys has a primary token count (§11.10/12)
        state = hash_map.insert_key_on_block(state, key, dst, tokens)  # tokens: primary only
    return Outcome(state)


def evict_blocks(state: PoolState, block_ids: tuple[int, ...]) -> Outcome:
    """Drop the cache identity of each listed block (a KV connector lost its copy). O(len).

    Ref counts, queue positions and watchers are untouched; an in-use block simply goes to
    the front when freed later. One ``BlockRemoved`` per removed key.
    """
    _raise_if(pre.evict_blocks_rejection(state, block_ids))
    events = _EventSink(state)
    for b in block_ids:
        state, removed = hash_map.remove_all_keys(state, b)
        events.removed(removed)
    state, records = events.finish(state)
    return Outcome(state, None, records)


def reset_prefix_cache(state: PoolState) -> Outcome:
    """Forget the whole prefix cache, if no block besides the null block is held.

    Result ``False`` (and no change) while any block is held. Otherwise every key goes, every
    watcher fires (table order), one ``AllBlocksCleared`` is emitted, queue order is kept.
    """
    if state.num_blocks - len(state.free_queue) != 1:
        return Outcome(state, False)
    fired = state.watchers
    state = replace(
        state,
        cache={},
        secondary_keys={},
        primary_key=(None,) * state.num_blocks,
        primary_tokens=(None,) * state.num_blocks,
        watchers=(),
    )
    events = _EventSink(state)
    events.add(ClearedRecord)
    state, records = events.finish(state)
    return Outcome(state, True, records, fired)


def emit_cached_block_events(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    num_cached: int,
    block_size: int,
    group_id: int,
) -> Outcome:
    """Report positions ``0…num_cached-1`` as stored (full reporting); no state change.

    With events on and ``num_cached > 0``: one ``BlockStored`` covering every position,
    including those held by null blocks.
    """
    _raise_if(
        pre.emit_cached_block_events_rejection(
            state, block_hashes, num_cached, block_size, group_id
        )
    )
    if num_cached == 0:
        return Outcome(state)
    hashes = pre.hashes_at_block_size(state, block_hashes, block_size)
    events = _EventSink(state)
    events.add(
        lambda seq: StoredRecord(
            seq,
            group_id,
            block_size,
            0,
            num_cached,
            tuple(range(num_cached)),
            hashes[:num_cached],
        )
    )
    state, records = events.finish(state)
    return Outcome(state, None, records)


# ---------------------------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------------------------


def is_block_writable(state: PoolState, block_id: int) -> Outcome:
    """Whether the sole owner may write the block in place: not null, ref 1, no key."""
    _raise_if(pre.is_block_writable_rejection(state, block_id))
    writable = (
        block_id != NULL_BLOCK_ID
        and state.ref_cnt[block_id] == 1
        and not keys_of_block(state, block_id)
    )
    return Outcome(state, writable)


def get_num_free_blocks(state: PoolState) -> int:
    """Free blocks, cached candidates and unpinned blocks included."""
    return len(state.free_queue)


def usage_fraction(num_blocks: int, num_free: int) -> float:
    """``1 - free / (N - 1)`` evaluated exactly so (§6.12: other algebraically equal forms
    differ in the last bit), ``0`` for a one-block pool. The one place usage is computed:
    :meth:`kvpool.shell.PoolShell.get_usage` calls it with its free count. O(1)."""
    total = num_blocks - 1
    if not total:
        return 0
    return 1.0 - (num_free / total)


def get_usage(state: PoolState) -> float:
    """Fraction of usable blocks held; cached candidates and unpinned blocks count as free."""
    return usage_fraction(state.num_blocks, len(state.free_queue))


__all__ = [
    "Outcome",
    "cache_full_blocks",
    "cache_partial_block",
    "emit_cached_block_events",
    "evict_blocks",
    "free_blocks",
    "get_cached_block",
    "get_new_blocks",
    "get_num_free_blocks",
    "get_usage",
    "is_block_writable",
    "move_block_hashes",
    "reset_prefix_cache",
    "touch",
    "unpin_blocks",
    "usage_fraction",
]
