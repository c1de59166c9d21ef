"""The conformance tier's classes of known differences from vLLM 0.25.1 (BEHAVIOUR.md §12):
each names exactly the divergence it explains, nothing wider (vLLM itself is not needed)."""

from __future__ import annotations

import pytest

from kvpool.harness.conformance import classify
from kvpool.harness.stack.machine import StackDivergence

UNDERCOUNT = "mamba-align-external-tokens-sized"


def divergence(what: str, vllm: tuple, kvpool: tuple) -> StackDivergence:
    error = StackDivergence("...")
    error.what, error.outcomes = what, (vllm, kvpool)
    return error


@pytest.mark.parametrize("vllm", [
    ("crash", "ValueError: Cannot get 1 free blocks from the pool"),  # fails half way
    ("ok", ("blocks", ([25, 14, 43], [26]))),  # or takes a block beyond the budget
])
def test_vllms_mamba_undercount_with_external_tokens_is_explained(vllm) -> None:
    error = divergence("allocate_slots(r1415, 48, 0, 6 external)", vllm, ("ok", None))
    assert classify(error, "full+mamba") == UNDERCOUNT


@pytest.mark.parametrize("what, config, kvpool", [
    ("allocate_slots(r1, 48, 0)", "full+mamba", ("ok", None)),  # no external tokens
    ("allocate_slots(r1, 48, 0, 6 external)", "full", ("ok", None)),  # no Mamba group
    ("allocate_slots(r1, 48, 0, 6 external)", "full+mamba",
     ("ok", ("blocks", ([25, 14, 43], [26])))),  # kvpool allocated too: a real difference
])
def test_other_allocation_differences_stay_unexplained(what, config, kvpool) -> None:
    error = divergence(what, ("ok", ("blocks", ([25, 14, 43], [26]))), kvpool)
    assert classify(error, config) is None
