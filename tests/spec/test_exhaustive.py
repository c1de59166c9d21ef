"""The bounded exhaustive checker: every reachable state of tiny pools, every call from each.

Default run: the small scopes (about 20 s on two shared cores). ``-m slow`` adds the larger
ones (two groups and three keys, four blocks, a coarse block size, caching off).
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
          f"{report.seconds:.1f} s")
    assert report.ok, report.failure


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
