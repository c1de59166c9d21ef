"""Optional tier: kvpool's facade against vLLM's own ``KVCacheManager``.

Skipped unless ``KVPOOL_VLLM_PYTHON`` names a python that imports vLLM (the kits:
``/tmp/anchors/vllm025/venv/bin/python`` compares the 0.25.1 configurations,
``/tmp/anchors/vllm033/venv/bin/python`` the copy-on-write and circular-buffer ones, see
``kvpool.harness.conformance.default_configurations``); kvpool's dependencies come from
``KVPOOL_VLLM_DEPS`` (default: ``<kit>/kvpool-deps``). ``KVPOOL_VLLM_STEPS`` sets the steps
per configuration (default 2000). Every difference must be classified against BEHAVIOUR.md.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

PYTHON = os.environ.get("KVPOOL_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not PYTHON, reason="set KVPOOL_VLLM_PYTHON to a vLLM python")


def test_kvpool_facade_conforms_to_vllms_kv_cache_manager() -> None:
    assert PYTHON is not None
    kit = Path(PYTHON).absolute().parent.parent.parent  # <kit>/venv/bin/python; no resolve:
    # a venv's python is a symlink to the base interpreter
    deps = os.environ.get("KVPOOL_VLLM_DEPS", str(kit / "kvpool-deps"))
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=f"{src}:{deps}", VLLM_LOGGING_LEVEL="ERROR")
    steps = os.environ.get("KVPOOL_VLLM_STEPS", "2000")
    out = subprocess.run([PYTHON, "-m", "kvpool.harness.conformance", "--steps", steps,
                          "--json"], capture_output=True, text=True, env=env, timeout=3600)
    assert out.returncode in (0, 1) and out.stdout.strip(), out.stderr[-2000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(r["steps_compared"] >= int(steps) for r in results)
    unexplained = [u for r in results for u in r["unexplained"]]
    assert not unexplained, unexplained[0]
