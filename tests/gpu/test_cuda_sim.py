"""The numba-cuda kernels, run in Numba's CUDA simulator (no GPU needed)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba.cuda")


def test_cuda_kernels_under_the_simulator() -> None:
    script = Path(__file__).with_name("cuda_sim_checks.py")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok check_") == 4
