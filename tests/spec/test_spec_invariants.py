"""Each invariant catches, by name and with the right witnesses, a state crafted to break it;
states reached by the operations break none."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from spec_builders import key, make_state

from kvpool.spec import ops
from kvpool.spec.invariants import INVARIANTS, all_invariants_hold, violated_invariants
from kvpool.spec.state import initial_state

K1, K2, K3 = key(1), key(2), key(3)

VALID = make_state(
    5,
    ref={1: 1, 2: 2},
    queue=(4, 3),
    keys={1: (K1, 2), 3: (K2, 4)},
    secondary={1: (K3,)},
    watchers=(3,),
    events=True,
    hbs=2,
    event_count=7,
)

BROKEN = {
    # invariant name: (state, expected witnesses)
    "block_arrays_cover_every_id": (replace(VALID, ref_cnt=(0, 1, 2, 0)), ("ref_cnt",)),
    "null_block_is_inert": (replace(VALID, free_queue=(4, 3, 0)), ("queued",)),
    "ref_counts_are_non_negative": (make_state(3, ref={2: -1}, queue=(1,)), (2,)),
    "queue_holds_valid_distinct_ids": (replace(VALID, free_queue=(4, 3, 4)), (4,)),
    "queued_iff_unreferenced": (replace(VALID, free_queue=(4,)), (3,)),
    "primary_key_iff_in_table": (replace(VALID, cache={K2: (3,), K3: (1,)}), (1,)),
    "secondary_keys_need_a_primary": (
        make_state(3, ref={2: 1}, secondary={2: (K1,)}, cache={K1: (2,)}),
        (2,),
    ),
    "table_entries_belong_to_their_blocks": (
        replace(VALID, cache={**VALID.cache, K2: (3, 4)}),
        (K2,),
    ),
    "primary_tokens_are_hash_block_multiples": (
        replace(VALID, primary_tokens=(None, 3, None, 4, None)),
        (1,),
    ),
    "uncached_pool_has_no_keys": (
        make_state(3, ref={1: 1}, keys={1: (K1, 1)}, caching=False),
        (1,),
    ),
    "watchers_are_distinct_real_blocks": (replace(VALID, watchers=(3, 1, 3)), (3,)),
    "events_only_when_enabled": (replace(VALID, enable_events=False), (7,)),
}


def test_the_crafted_valid_state_breaks_nothing():
    assert violated_invariants(VALID) == []
    assert all_invariants_hold(VALID)


def test_every_invariant_has_a_crafted_violation():
    assert set(BROKEN) == {inv.name for inv in INVARIANTS}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_crafted_violation_is_reported_by_name_with_its_witnesses(name):
    state, witnesses = BROKEN[name]
    assert violated_invariants(state) == [(name, witnesses)]
    assert not all_invariants_hold(state)


@pytest.mark.parametrize(
    "state, witnesses",
    [
        (replace(VALID, hash_block_size=0), ("hash_block_size",)),
        (replace(VALID, num_blocks=0, ref_cnt=(), primary_key=(), primary_tokens=()),
         ("num_blocks",)),
        (replace(VALID, primary_key=VALID.primary_key[:4]), ("primary_key",)),
    ],
)
def test_a_shape_error_stops_the_check_before_other_predicates_index_arrays(state, witnesses):
    assert violated_invariants(state) == [("block_arrays_cover_every_id", witnesses)]


@pytest.mark.parametrize(
    "state, witnesses",
    [
        (make_state(3, keys={0: (K1, 1)}, queue=(1, 2)), ("keyed",)),
        (make_state(3, watchers=(0,)), ("watched",)),
        (make_state(3, ref={0: 1}), ("ref_cnt",)),
    ],
)
def test_the_null_block_is_never_keyed_watched_or_counted(state, witnesses):
    assert ("null_block_is_inert", witnesses) in violated_invariants(state)


@pytest.mark.parametrize(
    "state, name, witnesses",
    [
        (make_state(3, queue=(1, 2, 9)), "queue_holds_valid_distinct_ids", (9,)),
        (make_state(3, queue=(1,)), "queued_iff_unreferenced", (2,)),
        (replace(VALID, cache={**VALID.cache, K2: ()}), "table_entries_belong_to_their_blocks",
         (K2,)),
        (replace(VALID, primary_tokens=(None, 0, None, 4, None)),
         "primary_tokens_are_hash_block_multiples", (1,)),
        (replace(VALID, primary_tokens=(None, 2, None, None, None)),
         "primary_tokens_are_hash_block_multiples", (3,)),
        (replace(VALID, secondary_keys={1: (K1,)}), "secondary_keys_need_a_primary", (1,)),
        (replace(VALID, watchers=(9,)), "watchers_are_distinct_real_blocks", (9,)),
        (replace(VALID, event_count=-1), "events_only_when_enabled", (-1,)),
    ],
)
def test_other_shapes_of_each_violation_are_caught_too(state, name, witnesses):
    assert (name, witnesses) in violated_invariants(state)


def _scenario_states():
    """States along a scripted session touching every operation, then a seeded random tail."""
    s = initial_state(8, hash_block_size=2, enable_events=True)
    a, b, c = (b"a" * 8, b"b" * 8, b"c" * 8)
    steps = [
        lambda s: ops.get_new_blocks(s, 3),
        lambda s: ops.cache_full_blocks(s, (a, b, c), (1, 2, 3), 0, 2, 2, 0),
        lambda s: ops.cache_partial_block(s, (a, b, c), 3, 6, 0, 4),
        lambda s: ops.cache_partial_block(s, (a, b, c), 2, 2, 0, 4),  # a secondary key
        lambda s: ops.touch(s, (1,)),
        lambda s: ops.free_blocks(s, (3, 2, 1)),
        lambda s: ops.unpin_blocks(s, (1,)),
        lambda s: ops.get_new_blocks(s, 4),
        lambda s: ops.cache_full_blocks(s, (a, b), (4, 5), 0, 2, 2, 1),
        lambda s: ops.get_new_blocks(s, 1),
        lambda s: ops.move_block_hashes(s, 4, 6),
        lambda s: ops.evict_blocks(s, (5, 0)),
        lambda s: ops.free_blocks(s, tuple(x for x in range(1, 8) if s.ref_cnt[x] > 0)),
        lambda s: ops.reset_prefix_cache(s),
    ]
    states = [s]
    for step in steps:
        s = step(s).state
        states.append(s)
    return states


def test_states_reached_by_a_scripted_session_break_nothing():
    states = _scenario_states()
    assert any(st.secondary_keys for st in states) and any(st.watchers for st in states)
    for state in states:
        assert violated_invariants(state) == [], state


@pytest.mark.parametrize("seed", range(3))
def test_states_reached_by_random_allocation_and_release_break_nothing(seed):
    rng = random.Random(seed)
    state = initial_state(6, hash_block_size=1)
    for _ in range(200):
        held = [b for b in range(1, 6) if state.ref_cnt[b]]
        if held and rng.random() < 0.5:
            state = ops.free_blocks(state, (rng.choice(held),)).state
        elif state.free_queue:
            state = ops.get_new_blocks(state, rng.randint(1, len(state.free_queue))).state
            held = [b for b in range(1, 6) if state.ref_cnt[b]]
            blocks = tuple(rng.sample(held, min(len(held), 2)))
            hashes = tuple(bytes([rng.randrange(3)]) for _ in blocks)
            if not any(state.primary_key[b] for b in blocks):
                state = ops.cache_full_blocks(state, hashes, blocks, 0, len(blocks), 1, 0).state
        assert violated_invariants(state) == []
