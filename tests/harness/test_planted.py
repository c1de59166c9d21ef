"""Every planted bug is caught within the default budget, with a reproduction that replays it.

Each test prints how many steps the search took to find its bug (``pytest -s`` shows them;
``python -m kvpool.harness.detection`` prints the same table without pytest).
"""

from __future__ import annotations

import pytest

from kvpool.harness import Divergence, run_check
from kvpool.harness.bugs.pool import PLANTED, planted_class

from .budget import step_budget

DEFAULT_BUDGET = 20_000
"""Steps a planted bug may take to be found (the ci profile's budget)."""


LONG_HUNTS = {"duplicate_newest_first", "secondary_keys_reversed", "free_repeat_counted_once",
              "touch_stays_queued", "reuse_keeps_old_key"}
"""Planted bugs the machine takes 2.5 seconds and more to catch on two shared cores:
``long`` (run by ``.ci/run``), the others in the default run."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.long) if n in LONG_HUNTS
                                  else n for n in sorted(PLANTED)])
def test_planted_bug_is_caught_within_the_default_budget(name, record_property):
    report = run_check(["spec", f"planted:{name}"], step_budget(DEFAULT_BUDGET), seed=2024,
                       shrink_seconds=5)
    print(f"\n{name}: caught after {report.steps_to_first_divergence} steps "
          f"({report.failure_kind}); {PLANTED[name].bug}")
    record_property("steps_to_detection", report.steps_to_first_divergence)
    assert not report.ok, f"planted bug {name} survived {report.steps} steps"
    assert report.steps_to_first_divergence is not None
    namespace: dict = {}
    exec(compile(report.reproduction, f"<reproduction of {name}>", "exec"), namespace)
    with pytest.raises(Divergence):
        namespace["test_reproduction"]()


@pytest.mark.parametrize("name", ["free_zones_swapped",
                                  pytest.param("duplicate_newest_first", marks=pytest.mark.long)])
def test_planted_bug_is_caught_with_the_reference_as_oracle(name):
    report = run_check(["reference", f"planted:{name}"], step_budget(DEFAULT_BUDGET), seed=7,
                       shrink=False)
    assert not report.ok


def test_every_planted_pool_documents_its_bug():
    for name, cls in PLANTED.items():
        assert planted_class(name) is cls
        assert cls.backend_name == f"planted:{name}" and cls.bug
    with pytest.raises(ValueError, match="unknown planted bug"):
        planted_class("no_such_bug")
