"""Optional tier: kvpool's payloads equal vLLM 0.33's own encoder's, batch for batch.

Set ``KVPOOL_VLLM033_PYTHON`` to a vLLM 0.33 kit's python (e.g.
``/tmp/anchors/vllm033/venv/bin/python``); skipped otherwise. The kit python builds vLLM's
``KVEventBatch`` from the same event fields (``tests/wire/vllm_encode.py``, which imports no
kvpool) and encodes it as vLLM's publisher does. Compared: the golden cases, and every batch a
replay of the chat trace publishes, with int and with bytes block hashes.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("msgspec")

from kvpool.wire.encoding import encode_batch  # noqa: E402
from kvpool.workload.simulate import simulate  # noqa: E402

from .cases import CASES  # noqa: E402

KIT_PYTHON = os.environ.get("KVPOOL_VLLM033_PYTHON")
pytestmark = pytest.mark.skipif(not KIT_PYTHON, reason="set KVPOOL_VLLM033_PYTHON to a vLLM "
                                "0.33 kit's python to compare with vLLM's encoder")


def _workload_batches(use_int: bool) -> list[tuple[list, float, int | None]]:
    batches: list = []
    simulate(backend="reference", num_requests=60, num_blocks=400, warmup=False,
             pool_options={"use_int_block_hashes": use_int},
             event_sink=lambda events: batches.append((events, 1.7e9 + len(batches) / 8,
                                                       len(batches) % 3 or None)))
    return batches


def _vllm_payloads(jobs: list) -> list[bytes]:
    wire = [([{"type": type(e).__name__, **dataclasses.asdict(e)} for e in events], ts, rank)
            for events, ts, rank in jobs]
    script = Path(__file__).with_name("vllm_encode.py")
    done = subprocess.run([KIT_PYTHON, str(script)], input=pickle.dumps(wire),
                          capture_output=True, timeout=300,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return pickle.loads(done.stdout)


@pytest.fixture(scope="module")
def jobs_and_payloads():
    jobs = [(events, ts, rank) for _, events, ts, rank in CASES]
    jobs += _workload_batches(True) + _workload_batches(False)
    return jobs, _vllm_payloads(jobs)


def test_every_batch_is_byte_identical_to_vllms_encoding(jobs_and_payloads):
    jobs, payloads = jobs_and_payloads
    assert len(payloads) == len(jobs) > len(CASES) + 100
    mismatches = [i for i, ((events, ts, rank), theirs) in enumerate(zip(jobs, payloads,
                                                                         strict=True))
                  if encode_batch(events, ts, rank) != theirs]
    assert mismatches == []
    n_events = sum(len(events) for events, _, _ in jobs)
    print(f"\n{len(jobs)} batches, {n_events} events, byte-identical to vLLM 0.33")


def test_the_compared_batches_cover_all_three_event_kinds(jobs_and_payloads):
    jobs, _ = jobs_and_payloads
    kinds = {type(e).__name__ for events, _, _ in jobs for e in events}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    workload = {type(e).__name__ for events, _, _ in jobs[len(CASES):] for e in events}
    assert workload == {"BlockStored", "BlockRemoved"}  # a replay never resets the cache
