"""Optional tier: the harness against the real vLLM ``BlockPool`` (skipped without a kit).

Point it at Python interpreters that can import vLLM (and kvpool's dependencies)::

    KVPOOL_VLLM025_PYTHON=/tmp/anchors/vllm025/venv/bin/python \\
    KVPOOL_VLLM033_PYTHON=/tmp/anchors/vllm033/venv/bin/python \\
    .venv/bin/python -m pytest -q tests/harness/test_real_vllm.py

``KVPOOL_VLLM_PYTHON`` names one more (any version). Each run puts ``src/`` and, when it
exists, ``<kit>/kvpool-deps`` (see ``tools/vllm_side_deps.sh``) on ``PYTHONPATH``;
``KVPOOL_VLLM_PYTHONPATH`` adds more. Not in default CI: nothing is collected unless one of
the variables is set. What it asserts (docs/harness.md, "Checking vLLM"):

* valid calls only: the run reaches its step budget with no divergence, and the only
  deviation tolerated is the documented set order of secondary keys; ``--json`` prints
  exactly one JSON object on stdout;
* with §12's invalid calls: every divergence found is made by an invalid-call rule (a
  documented BEHAVIOUR.md §12 row), never by a valid one.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvpool.harness.pool.set_order import DEVIATION
from kvpool.harness.rules.hostile import HostileRules, WrongTypeRules
from kvpool.harness.rules.invalid import InvalidCallRules

ROOT = Path(__file__).resolve().parents[2]
VARIABLES = ("KVPOOL_VLLM025_PYTHON", "KVPOOL_VLLM033_PYTHON", "KVPOOL_VLLM_PYTHON")
KITS = [(name, os.environ[name]) for name in VARIABLES if os.environ.get(name)]
VALID_STEPS = int(os.environ.get("KVPOOL_VLLM_STEPS", "20000"))
INVALID_SEEDS = (1, 2, 3)

pytestmark = pytest.mark.skipif(not KITS, reason="no vLLM python configured "
                                "(set KVPOOL_VLLM025_PYTHON / KVPOOL_VLLM033_PYTHON)")


def run_kvpool_check(python: str, *args: str) -> tuple[dict, str]:
    kit = Path(os.path.abspath(python)).parents[2]  # venv/bin/python: not resolved (a symlink)
    paths = [str(ROOT / "src")]
    if (kit / "kvpool-deps").is_dir():
        paths.append(str(kit / "kvpool-deps"))
    if os.environ.get("KVPOOL_VLLM_PYTHONPATH"):
        paths.append(os.environ["KVPOOL_VLLM_PYTHONPATH"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths),
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    done = subprocess.run(
        [python, "-m", "kvpool", "check", "--backends", "spec,vllm", "--json", *args],
        capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr  # stdout must be one JSON object, nothing else


@pytest.mark.parametrize("variable,python", KITS, ids=[k for k, _ in KITS])
def test_valid_calls_agree_with_the_spec_up_to_documented_set_order(variable, python):
    report, _ = run_kvpool_check(python, "--valid-only", "--steps", str(VALID_STEPS),
                                 "--seed", "7")
    assert report["divergences"] == 0 and report["invariant_violations"] == 0, report["failure"]
    assert report["steps"] >= VALID_STEPS
    assert set(report["documented_deviations"]) <= {DEVIATION}


@pytest.mark.parametrize("variable,python", KITS, ids=[k for k, _ in KITS])
@pytest.mark.parametrize("seed", INVALID_SEEDS)
def test_invalid_calls_diverge_only_on_documented_rows(variable, python, seed):
    report, _ = run_kvpool_check(python, "--steps", "3000", "--seed", str(seed), "--no-shrink")
    if report["divergences"] or report["invariant_violations"]:
        rule, failure = report["failure_rule"], report["failure"]
        raising_watcher = "WatcherRefused" in failure  # §12 "exception raised by a watcher"
        invalid_rule = (rule in vars(InvalidCallRules)
                        and not InvalidCallRules._rule_is_valid(rule))
        # Every rule of these two families passes a wrong type or a hostile value (they run
        # only with invalid calls on): vLLM does not check types, kvpool raises typed errors.
        hostile_rule = rule in vars(HostileRules) or rule in vars(WrongTypeRules)
        assert raising_watcher or invalid_rule or hostile_rule, (
            f"a valid rule diverged against vLLM: {failure}")
