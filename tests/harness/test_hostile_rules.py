"""The hostile rules (issue 7) find what they are for: a pool that lets a callback call back
in, or lets a collector's exception escape half-way, is reported as a divergence."""

from __future__ import annotations

import pytest

from kvpool.harness import run_check
from kvpool.harness.config import HarnessConfig
from kvpool.harness.differential import build_machine
from kvpool.shell import PoolShell


def test_the_machine_carries_the_hostile_rules():
    machine = build_machine(HarnessConfig())
    names = set(dir(machine))
    for rule in ("a_watcher_calling_back_into_the_pool_is_refused_and_all_watchers_fire",
                 "metrics_collectors_that_raise_or_call_back_leave_operations_whole",
                 "a_hash_that_is_not_bytes_is_rejected_before_any_key",
                 "a_request_an_event_cannot_describe_is_refused_with_events_on",
                 "tokens_are_normalised_or_rejected_naming_the_position"):
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
