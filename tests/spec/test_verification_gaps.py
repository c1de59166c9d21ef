"""Seeded bugs that used to survive the whole suite (issue 9, items 10 and 12).

Each test below fails on the seeded variant named in its docstring: a watcher on the null
block accepted by ``watchers_are_distinct_real_blocks``; ``free_blocks_post`` without the new
queue order; ``get_new_blocks_post`` comparing fired watchers as a set; the shell computing
usage itself instead of asking the spec.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from spec_builders import make_state

from kvpool import make_pool
from kvpool.spec import contracts, ops
from kvpool.spec.invariants import watchers_are_distinct_real_blocks
from kvpool.spec.postconditions import free_blocks_post, get_new_blocks_post, get_usage_post
from kvpool.spec.state import initial_state


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
    import kvpool.shell as shell

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


@pytest.mark.parametrize("name", sorted(contracts.CONTRACTS))
def test_every_postcondition_rejects_a_wrong_result_event_watcher_or_side_effect(name):
    """Seeded: a dropped ``fired_watchers == ()``, ``result is None``, ``events == ...`` or
    ``only_changed(...)`` conjunct (the survivors of ``kvpool.verify.mutate``)."""
    state, calls = _sample_calls()
    args = calls[name]
    _, post = contracts.CONTRACTS[name]
    right = getattr(contracts, name)(state, *args)  # the real operation, contract checked
    for what, wrong in _wrong_outcomes(right):
        assert not post(state, *args, wrong), f"{name}_post accepts {what}"


def test_equal_counts_are_a_silent_no_op_whatever_else_is_wrong():
    """Seeded: ``num_cached > num_full`` instead of ``>=`` in the precondition (a survivor):
    with equal counts vLLM returns before reading blocks, size or hashes (§12 "not errors")."""
    state = ops.get_new_blocks(initial_state(4, hash_block_size=2), 1).state
    out = contracts.cache_full_blocks(state, (), (1,), 3, 3, 3, 0, None)  # bs 3 off the grid
    assert out.state == state and out.events == ()
