"""Seeded bugs that used to survive the whole suite (issue 9, items 10 and 12).

Each test below fails on the seeded variant named in its docstring: a watcher on the null
block accepted by ``watchers_are_distinct_real_blocks``; ``free_blocks_post`` without the new
queue order; ``get_new_blocks_post`` comparing fired watchers as a set; the shell computing
usage itself instead of asking the spec.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from spec_builders import key, make_state

from kvpool import make_pool
from kvpool.spec import contracts, ops
from kvpool.spec.invariants import violated_invariants, watchers_are_distinct_real_blocks
from kvpool.spec.postconditions import (
    cache_partial_block_post,
    free_blocks_post,
    get_new_blocks_post,
    get_usage_post,
    move_block_hashes_post,
)
from kvpool.spec.state import initial_state, keys_of_block, replace_at


def test_a_watcher_on_the_null_block_is_its_own_witness():
    """Seeded: ``0 <= b`` instead of ``0 < b``; null_block_is_inert would still see it, but
    the invariant named for watchers must say so too (reports name the invariant)."""
    state = make_state(3, watchers=(0, 2), queue=(1, 2))
    assert watchers_are_distinct_real_blocks(state) == (0,)
    assert watchers_are_distinct_real_blocks(replace(state, watchers=(2, 1))) == ()


def _two_keyless_held() -> ops.PoolState:
    return ops.get_new_blocks(initial_state(5), 3).state  # blocks 1, 2, 3 held, queue (4,)


def test_free_blocks_post_pins_the_new_queue_order():
    """Seeded: the queue clause dropped (or compared as a set)."""
    state = _two_keyless_held()
    right = ops.free_blocks(state, (1, 2))
    assert right.state.free_queue == (1, 2, 4) and free_blocks_post(state, (1, 2), right)
    for queue in ((2, 1, 4), (4, 1, 2), (1, 4, 2)):
        wrong = right._replace(state=replace(right.state, free_queue=queue))
        assert not free_blocks_post(state, (1, 2), wrong), queue


def test_get_new_blocks_post_pins_the_firing_order_of_watchers():
    """Seeded: fired watchers compared as a set."""
    state = ops.unpin_blocks(_two_keyless_held(), (2, 1)).state  # watchers (2, 1), queue 4, 2, 1
    right = ops.get_new_blocks(state, 3)
    assert right.fired_watchers == (2, 1) and get_new_blocks_post(state, 3, right)
    assert not get_new_blocks_post(state, 3, right._replace(fired_watchers=(1, 2)))


@pytest.mark.parametrize("num_blocks,held", [(1, 0), (2, 1), (5, 0), (5, 2), (5, 4)])
def test_get_usage_has_a_contract_and_the_exact_value(num_blocks, held):
    state = ops.get_new_blocks(initial_state(num_blocks), held).state
    outcome = contracts.get_usage(state)  # icontract checks get_usage_post here
    expected = 0 if num_blocks == 1 else 1.0 - (num_blocks - 1 - held) / (num_blocks - 1)
    assert outcome.result == expected
    assert not get_usage_post(state, outcome._replace(result=held / num_blocks or 0.5))


@pytest.mark.parametrize("backend", ["spec", "reference", "fast"])
def test_the_shell_takes_usage_from_the_spec(backend, monkeypatch):
    """Seeded: the shell's own formula (a second source of truth) would ignore this."""
    import kvpool.shell.pool as shell

    pool = make_pool(5, backend=backend)
    pool.get_new_blocks(2)
    assert pool.get_usage() == 0.5
    monkeypatch.setattr(shell, "usage_fraction", lambda n, free: ("spec", n, free))
    assert pool.get_usage() == ("spec", 5, 2)


# -- item 9: postconditions that let a wrong outcome through (mutation survivors) -------------

def _sample_calls():
    """One valid call per operation, from a state with keys, a watcher and events on."""
    from kvpool.harness.requests import make_request

    hashes = tuple(make_request([1, 2, 3, 4], hash_block_size=2).block_hashes)
    state = initial_state(6, hash_block_size=2, enable_events=True)
    state = ops.get_new_blocks(state, 4).state
    state = ops.cache_full_blocks(state, hashes, (1, 2), 0, 2, 2, 0).state
    state = ops.unpin_blocks(state, (4,)).state  # a watcher on block 4, now free
    return state, {
        "get_new_blocks": (1,), "touch": ((1,),), "free_blocks": ((3,),),
        "unpin_blocks": ((3,),), "get_cached_block": (hashes[0], (0,)),
        "cache_full_blocks": (hashes, (1, 3), 1, 2, 2, 0, None),
        "cache_partial_block": (hashes, 3, 2, 1, 2, False),
        "move_block_hashes": (1, 3), "evict_blocks": ((2,),), "reset_prefix_cache": (),
        "emit_cached_block_events": (hashes, 2, 2, 0), "is_block_writable": (3,),
        "get_usage": (),
    }


def _wrong_outcomes(right: ops.Outcome):
    from kvpool.spec.records import ClearedRecord

    yield "an extra fired watcher", right._replace(fired_watchers=(*right.fired_watchers, 5))
    yield "a different result", right._replace(result=("not", "the", "result"))
    yield "an extra event", right._replace(events=(*right.events, ClearedRecord(99)))
    if right.events:  # as many events, other content: the counter alone cannot tell
        yield "a different event", right._replace(
            events=tuple(ClearedRecord(e.seq) if not isinstance(e, ClearedRecord)
                         else ClearedRecord(e.seq + 1) for e in right.events))
    yield "a changed ref count", right._replace(
        state=replace(right.state, ref_cnt=(*right.state.ref_cnt[:-1],
                                            right.state.ref_cnt[-1] + 1)))
    yield "a changed watcher table", right._replace(
        state=replace(right.state, watchers=(*right.state.watchers, 5)))
    # Valid states both (the invariants cannot tell): only the postcondition can.
    yield "a skipped sequence number", right._replace(
        state=replace(right.state, event_count=right.state.event_count + 1))
    hbs = right.state.hash_block_size
    for b, tokens in enumerate(right.state.primary_tokens):
        if tokens is not None:
            yield f"block {b}'s token count grown", right._replace(state=replace(
                right.state, primary_tokens=replace_at(right.state.primary_tokens, b,
                                                       tokens + hbs)))


@pytest.mark.parametrize("name", sorted(contracts.CONTRACTS))
def test_every_postcondition_rejects_a_wrong_result_event_watcher_or_side_effect(name):
    """Seeded: a dropped ``fired_watchers == ()``, ``result is None``, ``events == ...``,
    ``only_changed(...)`` or ``counter_advanced(...)`` conjunct, or the token-count clause of
    ``keys_kept_except`` (the survivors of ``kvpool.verify.mutate``)."""
    state, calls = _sample_calls()
    args = calls[name]
    _, post = contracts.CONTRACTS[name]
    right = getattr(contracts, name)(state, *args)  # the real operation, contract checked
    for what, wrong in _wrong_outcomes(right):
        assert not post(state, *args, wrong), f"{name}_post accepts {what}"


def _other_branches():
    """Calls that take a postcondition's *other* branch: a no-op (equal counts, the null
    block, nothing to emit) or an accepted reset, from states with keys and events on."""
    state, calls = _sample_calls()
    hashes = calls["cache_full_blocks"][0]
    idle = ops.free_blocks(state, (1, 2, 3)).state  # nothing held: a reset is accepted
    return [
        ("cache_full_blocks", state, (hashes, (1, 3), 2, 2, 2, 0, None)),
        ("cache_partial_block", state, (hashes, 0, 2, 0, 2, False)),
        ("emit_cached_block_events", state, (hashes, 0, 2, 0)),
        ("get_new_blocks", state, (0,)),
        ("reset_prefix_cache", idle, ()),
    ]


@pytest.mark.parametrize("name,state,args", [pytest.param(*c, id=c[0]) for c in _other_branches()])
def test_every_postcondition_branch_rejects_a_wrong_outcome(name, state, args):
    """Seeded (seed-2 survivors): ``and`` → ``or`` in the no-op branch of
    ``cache_full_blocks_post``, ``result.state == state`` dropped from the null-block branch
    of ``cache_partial_block_post``, ``counter_advanced`` dropped from an accepted reset."""
    _, post = contracts.CONTRACTS[name]
    right = getattr(contracts, name)(state, *args)
    for what, wrong in _wrong_outcomes(right):
        assert not post(state, *args, wrong), f"{name}_post accepts {what}"


def test_a_batch_that_takes_a_block_past_the_limit_twice_is_refused():
    """Seeded: the per-block count of a ``touch`` batch made over the null block only
    (``b == NULL_BLOCK_ID``): a block one short of the limit, touched twice in one call."""
    from kvpool.errors import RefCountOverflow
    from kvpool.spec.state import MAX_REF_CNT

    state = make_state(3, ref={1: MAX_REF_CNT - 1})
    assert contracts.touch(state, (1,)).state.ref_cnt[1] == MAX_REF_CNT
    with pytest.raises(RefCountOverflow):
        ops.touch(state, (1, 1))
    with pytest.raises(RefCountOverflow):
        ops.touch(state, (0, 1, 0, 1))


def test_equal_counts_are_a_silent_no_op_whatever_else_is_wrong():
    """Seeded: ``num_cached > num_full`` instead of ``>=`` in the precondition (a survivor):
    with equal counts vLLM returns before reading blocks, size or hashes (§12 "not errors")."""
    state = ops.get_new_blocks(initial_state(4, hash_block_size=2), 1).state
    out = contracts.cache_full_blocks(state, (), (1,), 3, 3, 3, 0, None)  # bs 3 off the grid
    assert out.state == state and out.events == ()


# -- item 9: the *order* under a key and the primary's role (mutation survivors, seed 1) -------
#
# Every invariant ties the hash table to the blocks' keys as *sets* of (key, block) pairs, so a
# postcondition clause that pins the table, or a block's keys, can be dropped only where the
# rest of the postcondition already fixes the order of ids under a key and which key is the
# primary. Each test below feeds a postcondition an outcome that is a valid state (every
# invariant holds), agrees with every other clause and differs only in that order or role.

K1, K2, K3 = key(1), key(2), key(3)
H = tuple(bytes([h]) for h in range(4))  # block hashes; key(h) == pack_key(H[h], 0)


def _rejects(post, state, args, right, wrong_state) -> bool:
    """The wrong outcome is a valid state, differs from the right one, and ``post`` says no."""
    wrong = right._replace(state=wrong_state)
    assert violated_invariants(wrong_state) == [] and wrong_state != right.state
    return not post(state, *args, wrong)


def test_get_new_blocks_post_keeps_the_order_of_duplicates_under_a_key():
    """Seeded: ``after.cache == table_without(state.cache, popped)`` dropped."""
    state = make_state(5, keys={2: (K1, 1), 3: (K1, 1)}, queue=(1, 4, 2, 3))
    right = contracts.get_new_blocks(state, 1)
    assert right.state.cache == {K1: (2, 3)}  # the earliest duplicate still answers first
    wrong = replace(right.state, cache={K1: (3, 2)})
    assert _rejects(get_new_blocks_post, state, (1,), right, wrong)


def test_cache_partial_block_post_keeps_a_longer_primary_primary():
    """Seeded: ``keys_of_block(after, block_id) == keys`` dropped: a shorter entry joins a
    block whose primary covers more tokens as a *secondary*; swapping the two roles keeps
    the table and the token count."""
    state = make_state(4, ref={1: 1}, keys={1: (K2, 2)})
    args = (H[1:3], 1, 1, 0, 2, False)  # the entry ending at token 1: key(1)
    right = contracts.cache_partial_block(state, *args)
    assert keys_of_block(right.state, 1) == (K2, K1)
    wrong = replace(right.state, primary_key=replace_at(right.state.primary_key, 1, K1),
                    secondary_keys={1: (K2,)})
    assert _rejects(cache_partial_block_post, state, args, right, wrong)


def test_cache_partial_block_post_makes_the_new_entry_the_newest_duplicate():
    """Seeded: the ``after.cache == table_with(...)`` clause dropped."""
    state = make_state(4, ref={1: 1, 2: 1}, keys={1: (K1, 1)})
    args = (H[1:3], 2, 1, 0, 2, False)
    right = contracts.cache_partial_block(state, *args)
    assert right.state.cache == {K1: (1, 2)}
    wrong = replace(right.state, cache={K1: (2, 1)})
    assert _rejects(cache_partial_block_post, state, args, right, wrong)


def _move_state():
    """Block 1 (held) carries K1 over 2 tokens and the secondary K2; block 2 is held and
    keyless; block 3 carries K3 and stays out of the move."""
    return make_state(5, ref={1: 1, 2: 1, 3: 1}, keys={1: (K1, 2), 3: (K3, 1)},
                      secondary={1: (K2,)})


def test_move_block_hashes_post_hands_over_the_keys_in_order():
    """Seeded: ``keys_of_block(after, dst) == moved`` dropped: the destination's table
    entries and token count alone allow the secondary to become its primary."""
    state = _move_state()
    right = contracts.move_block_hashes(state, 1, 2)
    assert keys_of_block(right.state, 2) == (K1, K2)
    wrong = replace(right.state, primary_key=replace_at(right.state.primary_key, 2, K2),
                    secondary_keys={2: (K1,)})
    assert _rejects(move_block_hashes_post, state, (1, 2), right, wrong)


def test_move_block_hashes_post_keeps_the_token_count_of_the_primary():
    """Seeded: ``after.primary_tokens[dst] == state.primary_tokens[src]`` dropped."""
    state = _move_state()
    right = contracts.move_block_hashes(state, 1, 2)
    assert right.state.primary_tokens[2] == 2
    wrong = replace(right.state, primary_tokens=replace_at(right.state.primary_tokens, 2, 3))
    assert _rejects(move_block_hashes_post, state, (1, 2), right, wrong)


def test_move_block_hashes_post_leaves_every_other_block_alone():
    """Seeded: ``keys_kept_except(state, after, (src, dst))`` dropped: block 3's token count
    and, with a second key, its primary are pinned only there."""
    state = replace(_move_state(), secondary_keys={1: (K2,), 3: (key(0),)},
                    cache={K1: (1,), K2: (1,), K3: (3,), key(0): (3,)})
    right = contracts.move_block_hashes(state, 1, 2)
    grown = replace(right.state, primary_tokens=replace_at(right.state.primary_tokens, 3, 2))
    assert _rejects(move_block_hashes_post, state, (1, 2), right, grown)
    swapped = replace(right.state, primary_key=replace_at(right.state.primary_key, 3, key(0)),
                      secondary_keys={**right.state.secondary_keys, 3: (K3,)})
    assert _rejects(move_block_hashes_post, state, (1, 2), right, swapped)
