"""The ``long`` marker: left out of the README's test command, never out of CI.

``tests/conftest.py`` deselects ``long`` tests unless ``-m`` names the marker (or
``KVPOOL_RUN_LONG`` is set); ``.ci/run`` runs them as a step of their own, so a planted bug
or a robustness check moved behind the marker still runs on every build.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _collected(*args: str, **env: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *args, "tests/harness/test_check.py"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env}, check=True)
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_the_ci_script_runs_the_long_checks_after_the_readme_command():
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if "pytest" in line and not line.lstrip().startswith("#")]
    assert steps == [".venv/bin/python -m pytest -q -n 2",
                     ".venv/bin/python -m pytest -q -n 2 -m long"]


def test_long_checks_are_deselected_by_default_and_selected_by_the_marker():
    full_budget = "test_spec_and_reference_agree_over_the_default_step_budget[70000]"
    default = _collected()
    assert default and not any(full_budget in t for t in default)
    assert any(full_budget in t for t in _collected("-m", "long"))
    assert any(full_budget in t for t in _collected(KVPOOL_RUN_LONG="1"))
