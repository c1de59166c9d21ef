"""Broken copies of the prefix-cache operations (see the package docstring)."""

from __future__ import annotations

from dataclasses import replace

from kvpool.keys import pack_key
from kvpool.spec import hash_map
from kvpool.spec import preconditions as pre
from kvpool.spec.contracts import contract_of
from kvpool.spec.ops import Outcome, _EventSink, _raise_if
from kvpool.spec.records import ClearedRecord, PartialStoredRecord, StoredRecord
from kvpool.spec.state import NULL_BLOCK_ID, BlockIds, PoolState, replace_at


def _cache_full_blocks(state, block_hashes, block_ids, num_cached, num_full, block_size,
                       group_id, mask, *, tokens_of, promote):
    """ops.cache_full_blocks with the covered-token rule and the promotion step as parameters."""
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
            state = promote(state, b, events)
        state = hash_map.insert_key_on_block(
            state, pack_key(hashes[k], group_id), b, tokens_of(k, block_size)
        )
        positions.append(k)
    events.add(lambda seq: StoredRecord(seq, group_id, block_size, num_cached, num_full,
                                        tuple(positions), tuple(hashes[k] for k in positions)))
    state, records = events.finish(state)
    return Outcome(state, None, records)


def _promote(state, b, events):
    state, removed = hash_map.remove_all_keys(state, b)
    events.removed(removed)
    return state


@contract_of("cache_full_blocks")
def cache_full_blocks_token_count_off_by_one(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_ids: BlockIds,
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    mask: tuple[bool, ...] | None,
) -> Outcome:
    """Position k is recorded as covering k·bs tokens instead of (k+1)·bs."""
    return _cache_full_blocks(
        state, block_hashes, block_ids, num_cached, num_full, block_size, group_id, mask,
        tokens_of=lambda k, bs: k * bs if k > 0 else bs,  # BUG: (k + 1) * bs
        promote=_promote,
    )


@contract_of("cache_full_blocks")
def cache_full_blocks_promotion_keeps_old_key_in_table(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_ids: BlockIds,
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
    mask: tuple[bool, ...] | None,
) -> Outcome:
    """Promotion resets the block's keys but leaves its old table entry behind."""

    def promote_without_table(state, b, events):
        # BUG: the block forgets its keys, the table does not (a stale entry).
        return replace(
            state,
            primary_key=replace_at(state.primary_key, b, None),
            primary_tokens=replace_at(state.primary_tokens, b, None),
            secondary_keys={k: v for k, v in state.secondary_keys.items() if k != b},
        )

    return _cache_full_blocks(
        state, block_hashes, block_ids, num_cached, num_full, block_size, group_id, mask,
        tokens_of=lambda k, bs: (k + 1) * bs,
        promote=promote_without_table,
    )


@contract_of("cache_partial_block")
def cache_partial_block_never_grows(
    state: PoolState,
    block_hashes: tuple[bytes, ...],
    block_id: int,
    num_tokens: int,
    group_id: int,
    block_size: int,
    replace_existing: bool,
) -> Outcome:
    """A longer entry on a block with a shorter primary becomes a secondary (no growth)."""
    _raise_if(pre.cache_partial_block_rejection(
        state, block_hashes, block_id, num_tokens, group_id, block_size))
    if block_id == NULL_BLOCK_ID:
        return Outcome(state, None)
    block_hash = block_hashes[num_tokens // state.hash_block_size - 1]
    key = pack_key(block_hash, group_id)
    already = state.primary_key[block_id] == key or block_id in state.cache.get(key, ())
    events = _EventSink(state)
    if replace_existing:  # BUG: a shorter primary should also be dropped first
        state, removed = hash_map.remove_all_keys(state, block_id)
        events.removed(removed)
        already = False
    state = hash_map.insert_key_on_block(state, key, block_id, num_tokens)
    if not already:
        events.add(lambda seq: PartialStoredRecord(seq, group_id, num_tokens, block_hash))
    state, records = events.finish(state)
    return Outcome(state, key, records)


@contract_of("move_block_hashes")
def move_block_hashes_moves_only_the_primary(state: PoolState, src: int, dst: int) -> Outcome:
    """Only the primary key moves; the source's secondary keys are silently dropped."""
    _raise_if(pre.move_block_hashes_rejection(state, src, dst))
    tokens = state.primary_tokens[src]
    state, moved = hash_map.remove_all_keys(state, src)
    for key in moved[:1]:  # BUG: every moved key should go to dst
        state = hash_map.insert_key_on_block(state, key, dst, tokens)
    return Outcome(state)


@contract_of("evict_blocks")
def evict_blocks_forgets_secondaries(state: PoolState, block_ids: BlockIds) -> Outcome:
    """Eviction removes the primary entry only; secondary entries stay in the table."""
    _raise_if(pre.evict_blocks_rejection(state, block_ids))
    events = _EventSink(state)
    for b in block_ids:
        key = state.primary_key[b]
        if key is None:
            continue
        cache, _ = hash_map.pop(state.cache, key, b)  # BUG: secondaries are not popped
        secondary = {k: v for k, v in state.secondary_keys.items() if k != b}
        state = replace(
            state,
            cache=cache,
            secondary_keys=secondary,
            primary_key=replace_at(state.primary_key, b, None),
            primary_tokens=replace_at(state.primary_tokens, b, None),
        )
        events.removed((key,))
    state, records = events.finish(state)
    return Outcome(state, None, records)


@contract_of("reset_prefix_cache")
def reset_prefix_cache_ignores_held_blocks(state: PoolState) -> Outcome:
    """The reset goes ahead while blocks are held (vLLM refuses and returns False)."""
    fired = state.watchers  # BUG: no check that only the null block is out of the queue
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


@contract_of("get_cached_block")
def get_cached_block_returns_newest_duplicate(
    state: PoolState, block_hash: bytes, group_ids: tuple[int, ...]
) -> Outcome:
    """Under a key with several blocks, the newest one answers instead of the earliest."""
    _raise_if(pre.get_cached_block_rejection(state, block_hash, group_ids))
    hits = []
    for g in group_ids:
        ids = state.cache.get(pack_key(block_hash, g), ())
        if not ids:
            return Outcome(state, None)
        hits.append(ids[-1])  # BUG: ids[0] is the earliest inserted
    return Outcome(state, tuple(hits))


@contract_of("is_block_writable")
def is_block_writable_ignores_keys(state: PoolState, block_id: int) -> Outcome:
    """A cached block with a single owner is reported writable (its content is shared)."""
    _raise_if(pre.is_block_writable_rejection(state, block_id))
    writable = block_id != NULL_BLOCK_ID and state.ref_cnt[block_id] == 1  # BUG: no key check
    return Outcome(state, writable)
