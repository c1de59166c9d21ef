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


@pytest.mark.parametrize("backend", ["spec", "reference"])
def test_the_shell_takes_usage_from_the_spec(backend, monkeypatch):
    """Seeded: the shell's own formula (a second source of truth) would ignore this."""
    import kvpool.shell as shell

    pool = make_pool(5, backend=backend)
    pool.get_new_blocks(2)
    assert pool.get_usage() == 0.5
    monkeypatch.setattr(shell, "usage_fraction", lambda n, free: ("spec", n, free))
    assert pool.get_usage() == ("spec", 5, 2)
