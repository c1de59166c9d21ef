"""The hashing benchmark's library function (the script and CLI only format its result)."""

from __future__ import annotations

import pytest

from kvpool.hashing import available_hash_algorithms
from kvpool.hashing.bench import format_hashing_bench, run_hashing_bench


def test_bench_reports_a_positive_rate_for_every_available_algorithm() -> None:
    results = run_hashing_bench(num_blocks=40, repeat=1)

    assert tuple(results) == available_hash_algorithms()
    assert all(rate > 0 for rate in results.values())
    table = format_hashing_bench(results)
    for name in results:
        assert name in table


def test_bench_can_be_restricted_to_named_algorithms() -> None:
    assert list(run_hashing_bench(num_blocks=10, repeat=2, algorithms=["sha256"])) == ["sha256"]


@pytest.mark.parametrize("kwargs", [{"num_blocks": 0}, {"repeat": 0}, {"block_size": 0}])
def test_bench_rejects_empty_workloads(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        run_hashing_bench(**kwargs)
