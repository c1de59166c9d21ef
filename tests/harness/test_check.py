"""``run_check`` and ``kvpool check``: the step budget, the report, the exit codes."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from kvpool.cli import main
from kvpool.harness import CheckReport, get_profile, harness_settings, run_check

from .budget import step_budget

REPORT_KEYS = {"steps", "divergences", "invariant_violations", "steps_per_s", "backends"}


@pytest.mark.parametrize("steps", [
    6_000,  # the quick run: every pool shape, a tenth of the budget
    pytest.param(70_000, marks=pytest.mark.long),  # the default step budget (~2.5 min)
])
def test_spec_and_reference_agree_over_the_default_step_budget(steps):
    report = run_check(["spec", "reference"], step_budget(steps), seed=20240607)
    print(f"\nspec,reference: {report.steps} steps at {report.steps_per_s:,.0f} steps/s "
          f"over {len(report.shapes)} pool shapes")
    assert report.ok, report.failure
    assert report.steps >= step_budget(steps)
    assert len(report.shapes) >= 3


def test_a_check_reports_its_budget_speed_and_seed():
    report = run_check(["spec", "spec"], 600, seed=11)
    assert isinstance(report, CheckReport) and report.ok
    assert report.steps >= 600 and report.examples > 0
    assert report.steps_per_s > 0 and report.seed == 11
    assert report.backends == ["spec", "spec#2"]
    assert REPORT_KEYS <= set(report.to_json())
    assert report.reproduction is None and report.steps_to_first_divergence is None


def test_the_same_seed_finds_the_same_failure_at_the_same_step():
    first = run_check(["spec", "planted:reuse_keeps_old_key"], 5000, seed=99, shrink=False)
    again = run_check(["spec", "planted:reuse_keeps_old_key"], 5000, seed=99, shrink=False)
    assert not first.ok and first.divergences == 1
    assert first.steps_to_first_divergence == again.steps_to_first_divergence
    assert first.failure == again.failure


def test_an_invariant_violation_is_counted_apart_from_divergences():
    report = run_check(["spec", "planted:touch_stays_queued"], 5000, seed=3, shrink=False)
    assert report.invariant_violations == 1 and report.divergences == 0
    assert report.failure_kind == "invariant"


def test_a_check_needs_a_positive_budget():
    with pytest.raises(ValueError, match="steps must be positive"):
        run_check(["spec"], 0)


def test_cli_prints_json_with_the_report_keys(capsys):
    status = main(["check", "--backends", "spec,reference", "--steps", "300", "--seed", "4",
                   "--json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0
    assert REPORT_KEYS <= set(out) and out["backends"] == ["spec", "reference"]
    assert out["divergences"] == 0 and out["steps"] >= 300 and out["seed"] == 4


def test_cli_prints_the_seed_and_no_progress_bar_into_a_pipe(capsys):
    status = main(["check", "--backends", "spec", "--steps", "200", "--seed", "8"])
    captured = capsys.readouterr()
    assert status == 0
    assert captured.err == ""  # the progress bar is drawn only on a terminal
    assert re.search(r"seed\s+8\b", captured.out)
    assert re.search(r"divergences\s+0\b", captured.out)


def test_cli_exits_1_and_prints_the_minimal_reproduction_on_divergence(capsys):
    status = main(["check", "--backends", "spec", "--planted", "free_batch_reversed",
                   "--steps", "5000", "--seed", "1"])
    out = capsys.readouterr().out
    assert status == 1
    assert "def test_reproduction():" in out and "# <- diverged here" in out


def test_cli_exits_2_for_an_unknown_backend_or_planted_bug(capsys):
    assert main(["check", "--backends", "spec,nope", "--steps", "10"]) == 2
    assert main(["check", "--planted", "nope", "--steps", "10"]) == 2
    if importlib.util.find_spec("vllm") is None:
        assert main(["check", "--backends", "spec,vllm", "--steps", "10"]) == 2
    assert "nope" in capsys.readouterr().err


def test_cli_lists_the_planted_bugs(capsys):
    assert main(["check", "--list-planted"]) == 0
    assert "touch_stays_queued" in capsys.readouterr().out


def test_profiles_scale_the_search_and_ci_is_reproducible():
    ci, nightly = get_profile("ci"), get_profile("nightly")
    assert ci.settings(100).derandomize and ci.settings(100).database is None
    assert nightly.settings(100).max_examples > ci.settings(100).max_examples
    assert get_profile("dev") is get_profile("local")
    assert harness_settings("ci", 7).max_examples == 7
    with pytest.raises(ValueError, match="unknown harness profile"):
        get_profile("weekly")
