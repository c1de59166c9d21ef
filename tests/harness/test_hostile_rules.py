"""The hostile rules (issue 7) find what they are for: a pool that lets a callback call back
in, or lets a collector's exception escape half-way, is reported as a divergence."""

from __future__ import annotations

import pytest

from kvpool.harness import run_check
from kvpool.harness.differential import build_machine
from kvpool.harness.pool.config import HarnessConfig
from kvpool.shell import PoolShell


def test_the_machine_carries_the_hostile_rules():
    machine = build_machine(HarnessConfig())
    names = set(dir(machine))
    for rule in ("a_watcher_calling_back_into_the_pool_is_refused_and_all_watchers_fire",
                 "metrics_collectors_that_raise_or_call_back_leave_operations_whole",
                 "a_hash_that_is_not_bytes_is_rejected_before_any_key",
                 "a_request_an_event_cannot_describe_is_refused_with_events_on",
                 "tokens_are_normalised_or_rejected_naming_the_position",
                 "a_block_mask_entry_that_is_not_a_bool_is_rejected_alike",
                 "a_block_mask_that_is_not_a_sequence_is_rejected_alike",
                 "a_lookup_without_a_list_of_group_ids_is_invalid_argument",
                 "replaying_garbage_is_invalid_event",
                 "make_pool_with_an_unknown_option_or_backend_is_typed",
                 "a_block_hasher_that_is_not_one_is_invalid_argument"):
        assert rule in names


@pytest.mark.parametrize("fault", ["reentry allowed", "collector error escapes"])
def test_a_pool_with_the_old_callback_behaviour_is_caught(monkeypatch, fault):
    if fault == "reentry allowed":
        monkeypatch.setattr(PoolShell, "_refuse_reentry", lambda self, method: None)
    else:
        deliver = PoolShell._deliver

        def raw_collector_calls(self, metrics, fired, result=None):
            for method, args in metrics:  # escapes with the watchers still pending
                getattr(self.metrics_collector, method)(*args)
            return deliver(self, (), fired, result)

        monkeypatch.setattr(PoolShell, "_deliver", raw_collector_calls)
    report = run_check(["spec", "reference"], 600, 1, shrink=False)
    assert not report.ok, fault
    assert report.failure


def _truthy_mask(mask):
    """allocate_and_cache's old mask reading on spec/reference: each entry's truthiness."""
    return None if mask is None else tuple(bool(m) for m in mask)


@pytest.mark.parametrize("fault", ["mask by truthiness", "group ids unchecked",
                                   "replay untyped", "hasher unchecked"])
def test_the_old_wrong_type_behaviour_is_caught(monkeypatch, fault):
    """Issue 23: each class, put back as it was, is found by a short hostile run."""
    import kvpool.batch
    import kvpool.events
    import kvpool.request
    import kvpool.shell.pool

    backends = ["spec", "fast"]
    if fault == "mask by truthiness":  # the composition (spec) only; fast keeps its check
        monkeypatch.setattr(kvpool.batch, "as_mask", _truthy_mask)
    elif fault == "group ids unchecked":
        monkeypatch.setattr(kvpool.shell.pool, "as_group_ids", lambda ids: tuple(ids))
        backends = ["spec", "reference"]
    elif fault == "replay untyped":
        monkeypatch.setattr(kvpool.events, "_malformed", lambda event: None)
        backends = ["spec"]
    else:
        monkeypatch.setattr(kvpool.request, "_hasher_result", lambda hashes: hashes)
        backends = ["spec"]
    report = run_check(backends, 1500, 3, shrink=False)
    assert not report.ok, fault
