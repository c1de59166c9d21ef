"""GPU-layer tests: torch CPU tensors (CUDA with ``KVPOOL_GPU_DEVICE=cuda``)."""

import os

import pytest

torch = pytest.importorskip("torch")

# Tiny tensors: torch's intra-op threads only contend with the other test worker.
torch.set_num_threads(1)

DEVICE = os.environ.get("KVPOOL_GPU_DEVICE", "cpu")


@pytest.fixture
def device() -> str:
    return DEVICE
