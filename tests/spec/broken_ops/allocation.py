"""Broken copies of the allocation and release operations (see the package docstring)."""

from __future__ import annotations

from dataclasses import replace

from kvpool.spec import free_queue, hash_map
from kvpool.spec import preconditions as pre
from kvpool.spec.contracts import contract_of
from kvpool.spec.ops import Outcome, _EventSink, _raise_if
from kvpool.spec.state import NULL_BLOCK_ID, BlockIds, PoolState


@contract_of("get_new_blocks")
def get_new_blocks_keeps_keys(state: PoolState, num_blocks: int) -> Outcome:
    """Allocation forgets the lazy eviction: a reused block keeps its old cache identity."""
    _raise_if(pre.get_new_blocks_rejection(state, num_blocks))
    popped, rest = free_queue.popleft_n(state.free_queue, num_blocks)
    fired = tuple(b for b in popped if b in state.watchers)
    state = replace(
        state, free_queue=rest, watchers=tuple(b for b in state.watchers if b not in popped)
    )
    ref_cnt = list(state.ref_cnt)
    for b in popped:
        ref_cnt[b] = 1  # BUG: no hash_map.remove_all_keys(state, b) when caching is on
    return Outcome(replace(state, ref_cnt=tuple(ref_cnt)), popped, (), fired)


@contract_of("get_new_blocks")
def get_new_blocks_events_restart_at_zero(state: PoolState, num_blocks: int) -> Outcome:
    """Eviction events are numbered from 0 instead of continuing the pool's sequence."""
    _raise_if(pre.get_new_blocks_rejection(state, num_blocks))
    popped, rest = free_queue.popleft_n(state.free_queue, num_blocks)
    fired = tuple(b for b in popped if b in state.watchers)
    state = replace(
        state, free_queue=rest, watchers=tuple(b for b in state.watchers if b not in popped)
    )
    events = _EventSink(state)
    events.next_seq = 0  # BUG: should continue from state.event_count
    ref_cnt = list(state.ref_cnt)
    for b in popped:
        if state.enable_caching:
            state, removed = hash_map.remove_all_keys(state, b)
            events.removed(removed)
        ref_cnt[b] = 1
    state, records = events.finish(replace(state, ref_cnt=tuple(ref_cnt)))
    return Outcome(state, popped, records, fired)


@contract_of("touch")
def touch_leaves_hits_queued(state: PoolState, block_ids: BlockIds) -> Outcome:
    """A prefix hit on a free cached block takes a reference but leaves it in the queue."""
    _raise_if(pre.touch_rejection(state, block_ids))
    ref_cnt = list(state.ref_cnt)
    for b in block_ids:
        if b == NULL_BLOCK_ID:
            continue
        ref_cnt[b] += 1  # BUG: a block at ref 0 is not unlinked from the free queue first
    return Outcome(replace(state, ref_cnt=tuple(ref_cnt)))


@contract_of("free_blocks")
def free_blocks_uncached_to_tail(state: PoolState, block_ids: BlockIds) -> Outcome:
    """Every freed block goes to the tail: uncached blocks are no longer reused first."""
    _raise_if(pre.free_blocks_rejection(state, block_ids))
    ref_cnt = list(state.ref_cnt)
    released: list[int] = []
    for b in block_ids:
        if b == NULL_BLOCK_ID:
            continue
        ref_cnt[b] -= 1
        if ref_cnt[b] == 0:
            released.append(b)  # BUG: blocks without a key belong at the front
    queue = free_queue.append_n(state.free_queue, tuple(released))
    return Outcome(replace(state, ref_cnt=tuple(ref_cnt), free_queue=queue))


@contract_of("free_blocks")
def free_blocks_front_batch_reversed(state: PoolState, block_ids: BlockIds) -> Outcome:
    """The front batch is prepended one block at a time, so it ends up in reverse order."""
    _raise_if(pre.free_blocks_rejection(state, block_ids))
    ref_cnt = list(state.ref_cnt)
    queue = state.free_queue
    to_tail: list[int] = []
    for b in block_ids:
        if b == NULL_BLOCK_ID:
            continue
        ref_cnt[b] -= 1
        if ref_cnt[b] == 0:
            if state.primary_key[b] is None or not state.enable_caching:
                queue = free_queue.prepend_n(queue, (b,))  # BUG: reverses the batch order
            else:
                to_tail.append(b)
    queue = free_queue.append_n(queue, tuple(to_tail))
    return Outcome(replace(state, ref_cnt=tuple(ref_cnt), free_queue=queue))


@contract_of("unpin_blocks")
def unpin_blocks_watches_only_released(state: PoolState, block_ids: BlockIds) -> Outcome:
    """A watcher is registered only when the block's count reaches 0 (not on every unpin)."""
    _raise_if(pre.unpin_blocks_rejection(state, block_ids))
    ref_cnt = list(state.ref_cnt)
    watchers = state.watchers
    released: list[int] = []
    for b in block_ids:
        ref_cnt[b] -= 1
        if ref_cnt[b] == 0:
            released.append(b)
            if b not in watchers:
                watchers = watchers + (b,)  # BUG: should happen for every listed block
    queue = free_queue.append_n(state.free_queue, tuple(released))
    return Outcome(replace(state, ref_cnt=tuple(ref_cnt), free_queue=queue, watchers=watchers))
