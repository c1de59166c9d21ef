"""The CLI's differential check over all three backends, compiled and as plain Python.

The second run sets ``NUMBA_DISABLE_JIT=1``: the fast backend's kernels then execute as the
plain Python they are written in, so a coverage run sees them and a failure can be debugged
with a Python debugger.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")


def run_check(steps: int, seed: int, **env: str) -> dict:
    command = [
        sys.executable, "-m", "kvpool", "check",
        "--backends", "spec,reference,fast", "--steps", str(steps), "--seed", str(seed), "--json",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={**os.environ, **env}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("steps", [3000, pytest.param(20000, marks=pytest.mark.long)])
def test_spec_reference_and_fast_agree_on_every_step(steps):
    report = run_check(steps, seed=20261129)
    assert report["backends"] == ["spec", "reference", "fast"]
    assert report["steps"] >= steps
    assert report["divergences"] == 0
    assert report["invariant_violations"] == 0


def test_fast_kernels_agree_when_run_as_plain_python():
    report = run_check(4000, seed=7, NUMBA_DISABLE_JIT="1")
    assert report["divergences"] == 0
    assert report["invariant_violations"] == 0
