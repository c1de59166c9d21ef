"""The whole-stack differential machine: every configuration agrees across spec, reference
and fast (CI budget), and every planted policy bug is caught within the default budget."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvpool.harness.bugs.stack import PLANTED_POLICY
from kvpool.harness.stack.configs import CONFIGURATIONS
from kvpool.harness.stack.run import run_stack_check

CI_STEPS = 600
PLANTED_BUDGET = 5000


@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_backends_agree_through_the_whole_stack(name) -> None:
    """Spec, reference and fast pools under the generic policy, and the fast policy where
    it serves the configuration (kvpool.policy.fast), all against the spec stack."""
    report = run_stack_check(name, ["spec", "reference", "fast", "fast-policy"], CI_STEPS,
                             seed=7)
    assert report.ok, report.failure
    assert report.coverage["allocations"] > 100
    served = name in ("full", "full-quiet", "full-eagle", "full-watermark", "full+swa",
                      "full+swa-quiet", "full+chunked-quiet", "full+chunked", "2full+swa",
                      "nocache")
    assert ("fast-policy" in report.backends) == served
    assert ("fast-policy" in report.skipped) == (not served)


@pytest.mark.parametrize("name", ["full", "full-quiet", "full-eagle", "full-watermark",
                                  "full+swa", "full+swa-quiet", "full+chunked-quiet",
                                  "2full+swa", "full+chunked"])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_fast_policy_decides_as_the_generic_one(name, seed) -> None:
    """Longer walks of the fast policy against the generic one on the reference pool."""
    report = run_stack_check(name, ["reference", "fast-policy"], 3 * CI_STEPS, seed=seed)
    assert report.ok, report.failure
    assert report.coverage["hits"] > 20 and report.coverage["allocation failures"] > 2


@pytest.mark.parametrize("name", list(PLANTED_POLICY))
def test_planted_policy_bug_is_caught(name) -> None:
    bug = PLANTED_POLICY[name]
    report = run_stack_check(bug.configuration, ["spec"], PLANTED_BUDGET, seed=11,
                             extra=[bug.stack()])
    assert not report.ok, f"{name} survived {report.steps} steps"
    assert f"planted:{name}" in (report.failure or "")


def test_cli_stack_layer_reports_per_configuration() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvpool", "check", "--layer", "stack", "--backends",
         "spec,fast", "--steps", "50", "--seed", "3", "--configuration", "full",
         "--configuration", "nocache", "--json"],
        capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert [c["configuration"] for c in report["configurations"]] == ["full", "nocache"]
    assert all(c["divergences"] == 0 and c["steps"] == 50 for c in report["configurations"])


def test_cli_stack_layer_exits_1_on_a_planted_bug() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvpool", "check", "--layer", "stack", "--backends", "spec",
         "--steps", "500", "--seed", "3", "--planted", "free-in-forward-order"],
        capture_output=True, text=True)
    assert out.returncode == 1 and "planted:free-in-forward-order" in out.stdout
