"""The bounded exhaustive checker: every reachable state of tiny pools, every call from each.

Default run: the small scopes (about 20 s on two shared cores). ``-m slow`` adds the larger
ones, each run to completion in a minute or two (two groups with two requests, three blocks
without a depth bound, a coarse block size, four blocks with caching off; docs/harness.md).
"""

from __future__ import annotations

import pytest

from kvpool.verify.exhaustive import LARGE_SCOPES, SMALL_SCOPES, Scope, calls_in_scope, explore


@pytest.mark.parametrize("scope", SMALL_SCOPES, ids=lambda s: s.name)
def test_every_reachable_state_of_a_small_scope_agrees_and_keeps_every_invariant(scope):
    report = explore(scope)
    print(f"\n{report.scope}: {report.states} states, {report.transitions} transitions "
          f"({report.accepted} accepted, {report.rejected} rejected), {report.seconds:.1f} s")
    assert report.ok, report.failure
    assert report.states >= 20 and report.accepted > 1000 and report.rejected > 1000


@pytest.mark.slow
@pytest.mark.parametrize("scope", LARGE_SCOPES, ids=lambda s: s.name)
def test_every_reachable_state_of_a_larger_scope_agrees(scope):
    report = explore(scope)
    print(f"\n{report.scope}: {report.states} states, {report.transitions} transitions, "
          f"{report.seconds:.1f} s ({report.cpu_seconds:.1f} s CPU)")
    assert report.ok, report.failure
    assert report.frontier == 0 and report.states >= 100  # ran to completion, not a stub


@pytest.mark.parametrize("bug,scope", [
    ("touch_repeat_counted_once", 0), ("writable_ignores_holders", 0),
    ("reuse_keeps_old_key", 0), ("free_zones_swapped", 1), ("usage_off_by_one", 0),
])
def test_a_planted_bug_is_found_with_the_path_that_reaches_it(bug, scope):
    report = explore(SMALL_SCOPES[scope], backends=("spec", f"planted:{bug}"))
    assert not report.ok
    assert "pool." in report.failure  # the calls that lead there, as lockstep lines


def test_the_scope_holds_invalid_calls_for_every_operation():
    ops = {c.op for c in calls_in_scope(Scope("x", num_blocks=3))}
    assert {"touch", "free_blocks", "unpin_blocks", "cache_full_blocks", "cache_partial_block",
            "move_block_hashes", "evict_blocks", "emit_cached_block_events", "get_cached_block",
            "is_block_writable", "reset_prefix_cache", "get_usage"} <= ops
    ids = {a for c in calls_in_scope(Scope("x", num_blocks=3)) if c.op == "touch"
           for a in c.args[0]}
    assert ids == {-1, 0, 1, 2, 3}


# -- symmetry: one state per class of renamed states (the slow scopes use it) ----------------

def _renamed_call(call, blocks, requests=None):
    """``call`` with block ids renamed (``blocks[old] == new``; −1 and N stay) and requests
    permuted (``requests[old] == new``)."""
    from kvpool.verify.exhaustive import Call, _RequestRef

    def rename(value, position):
        if isinstance(value, _RequestRef):
            return _RequestRef(requests[value.index]) if requests else value
        if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
            return tuple(blocks[v] if 0 <= v < len(blocks) else v for v in value)
        if isinstance(value, int) and not isinstance(value, bool) and position in ids_at:
            return blocks[value] if 0 <= value < len(blocks) else value
        return value

    ids_at = {"cache_partial_block": {1}, "move_block_hashes": {0, 1},
              "is_block_writable": {0}}.get(call.op, set())
    if call.op == "cache_full_blocks":  # (request, table, ...): the mask is not ids
        return Call(call.op, (rename(call.args[0], 0), rename(call.args[1], 1), *call.args[2:]))
    if call.op == "get_cached_block":  # every hash of every request: swapping requests
        return call                     # maps that set onto itself
    return Call(call.op, tuple(rename(a, i) for i, a in enumerate(call.args)))


def test_the_calls_of_a_scope_are_closed_under_renaming_blocks_and_requests():
    """What the symmetry reduction rests on: from a renamed state, the renamed call exists."""
    import itertools

    scope = Scope("x", num_blocks=4, prompts=((1, 2), (1, 3)), symmetry=True)
    calls = set(calls_in_scope(scope))
    for perm in itertools.permutations(range(1, 4)):
        blocks = (0, *perm)
        for requests in ((0, 1), (1, 0)):
            missing = [c for c in calls if _renamed_call(c, blocks, requests) not in calls]
            assert not missing, (blocks, requests, missing[:3])


def test_states_equal_up_to_renaming_share_one_canonical_key():
    from kvpool.harness.requests import make_request
    from kvpool.spec import ops
    from kvpool.spec.state import initial_state
    from kvpool.verify.exhaustive import canonical_key, renamings, state_key

    scope = Scope("x", num_blocks=4, prompts=((1, 2), (1, 3)), symmetry=True)
    r0, r1 = (make_request(p, hash_block_size=1, request_id="r") for p in scope.prompts)
    h0, h1 = tuple(r0.block_hashes), tuple(r1.block_hashes)

    def cached(hashes, table):  # hold three blocks, cache two of them
        state = ops.get_new_blocks(initial_state(4, hash_block_size=1), 3).state
        return ops.cache_full_blocks(state, hashes, table, 0, 2, 1, 0).state

    def walk(hashes, table):  # ... and free the second
        return ops.free_blocks(cached(hashes, table), (table[1],)).state

    symmetries = renamings(scope, [r0, r1])
    assert len(symmetries) == 12  # 3! block renamings × the request swap
    a, b, c = walk(h0, (1, 2)), walk(h1, (3, 1)), walk(h0, (2, 1))
    assert state_key(a) != state_key(b) != state_key(c)
    assert canonical_key(a, symmetries) == canonical_key(b, symmetries)
    assert canonical_key(a, symmetries) == canonical_key(c, symmetries)
    # ... but no renaming turns one queue order of two differently keyed blocks into the other
    x = ops.free_blocks(cached(h0, (1, 2)), (1, 2)).state
    y = ops.free_blocks(cached(h0, (1, 2)), (2, 1)).state
    assert canonical_key(x, symmetries) != canonical_key(y, symmetries)


def test_a_planted_bug_is_found_up_to_renaming_too():
    from dataclasses import replace

    scope = replace(SMALL_SCOPES[1], symmetry=True)
    report = explore(scope, backends=("spec", "planted:free_zones_swapped"))
    assert not report.ok and "pool." in report.failure
