"""Class 10 of issue 7: a pool too large for memory fails at once, naming the estimate."""

from __future__ import annotations

import time

import pytest
from hostile import BACKENDS, pool_of

from kvpool.errors import InvalidConfig
from kvpool.memory import CHECK_ABOVE_BYTES, available_memory_bytes, check_pool_fits


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pool_beyond_available_memory_is_refused_before_building(backend):
    start = time.thread_time()
    with pytest.raises(InvalidConfig, match=r"needs about .* GiB .* available"):
        pool_of(backend, 10**12)
    assert time.thread_time() - start < 1.0  # nothing was built


def test_the_estimate_is_compared_with_what_is_available():
    check_pool_fits("spec", 10**6, 128, available=2**30)  # 122 MiB of 1 GiB: fine
    with pytest.raises(InvalidConfig, match="spec pool of 10000000 blocks"):
        check_pool_fits("spec", 10**7, 128, available=2**30)
    check_pool_fits("spec", CHECK_ABOVE_BYTES // 128 - 1, 128, available=0)  # small: unchecked


def test_meminfo_is_read_where_it_exists(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  100 kB\nMemAvailable:   2048 kB\n")
    assert available_memory_bytes(meminfo) == 2048 * 1024
    assert available_memory_bytes(tmp_path / "missing") is None
