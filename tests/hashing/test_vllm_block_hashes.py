"""Optional tier: a kvpool request's block hashes are vLLM's own, byte for byte.

Set ``KVPOOL_VLLM025_PYTHON`` and/or ``KVPOOL_VLLM033_PYTHON`` to a vLLM kit's python (e.g.
``/tmp/anchors/vllm025/venv/bin/python``); skipped otherwise. The kit python builds vLLM's
``Request`` with vLLM's block hasher (``tests/hashing/vllm_block_hashes.py``, which imports no
kvpool) for the same prompts, with the same ``PYTHONHASHSEED``. The prompts exercise the
packed path of the pickled modes (:mod:`kvpool.hashing.pickled_blocks`): every pickle integer
width, block sizes around its limits, and the shapes it declines.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
from pathlib import Path

import pytest

from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.request import Request

SEED = "4242"  # PYTHONHASHSEED must be an integer for the interpreter itself
PYTHONS = {version: os.environ.get(f"KVPOOL_VLLM{version}_PYTHON") for version in ("025", "033")}


def _prompts() -> list[tuple[list[int], int, str]]:
    rng = random.Random(7)
    widths = [255, 65535, 2**31 - 1]
    jobs = []
    for name in ("sha256", "xxhash"):
        for block_size in (1, 3, 4, 16, 17, 64, 1024):
            for _ in range(3):
                n = rng.randrange(block_size, 12 * block_size + 64) + 64
                jobs.append(([rng.randint(0, rng.choice(widths)) for _ in range(n)],
                             block_size, name))
        jobs.append(([0, 255, 256, 65535, 65536, 2**31 - 1] * 40, 16, name))
    return jobs


@pytest.mark.parametrize("version", ["025", "033"])
def test_request_block_hashes_equal_vllms(version):
    python = PYTHONS[version]
    if not python:
        pytest.skip(f"set KVPOOL_VLLM{version}_PYTHON to a vLLM kit's python")
    pytest.importorskip("xxhash")
    jobs = _prompts()
    script = Path(__file__).with_name("vllm_block_hashes.py")
    done = subprocess.run([python, str(script)], input=pickle.dumps(jobs), capture_output=True,
                          timeout=600, env={**os.environ, "PYTHONHASHSEED": SEED,
                                            "VLLM_LOGGING_LEVEL": "WARNING"})
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    theirs = pickle.loads(done.stdout)
    assert all(h is not None for (_, _, name), h in zip(jobs, theirs, strict=True)
               if name == "sha256")
    for (prompt, block_size, name), expected in zip(jobs, theirs, strict=True):
        if expected is None:  # the kit has no xxhash package
            continue
        hasher = get_request_block_hasher(block_size, BlockHasher(name, seed=SEED))
        ours = Request("r", prompt, block_hasher=hasher).block_hashes
        assert list(ours) == expected, (name, block_size, len(prompt))
        assert len(expected) == len(prompt) // block_size
