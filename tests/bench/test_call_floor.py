"""The call-floor benchmark: every part of every operation is timed, and the table says how
the verb's time splits (timings themselves are never asserted)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("numba")

from kvpool.bench.call_floor import FIGURES, format_call_floor, run_call_floor  # noqa: E402


@pytest.mark.long
def test_every_part_is_measured_and_printed() -> None:
    result = run_call_floor(ops=200, rounds=1, num_blocks=2048)
    expected = {f"{f}/{p}" for f in FIGURES for p in ("kernel", "verb")}
    expected |= {"lookup_hit/empty", "lookup_hit/python", "alloc1_free1/empty",
                 "alloc1_free1/python"}
    assert set(result) == expected
    assert all(math.isfinite(v) and v >= 0 for v in result.values())
    table = format_call_floor(result)
    for figure in FIGURES:
        assert figure in table
    assert "method + " in table and " entry + " in table and " work" in table
