"""How benchmark samples become figures: medians, ratio direction, targets."""

from __future__ import annotations

import pytest

from kvpool.bench.config import size_label
from kvpool.bench.report import TARGETS, Target, direction, format_value, medians, ratios


def test_figures_are_medians_of_their_samples():
    assert medians({"fast": {"pool_s": [3.0, 1.0, 2.0]}}) == {"fast": {"pool_s": 2.0}}


@pytest.mark.parametrize(
    ("figure", "better"),
    [("alloc_free_64_blocks_per_s", "higher"), ("pool_s", "lower"),
     ("alloc_free_1_pair_us", "lower"), ("construct_1M_bytes_per_block", "lower"),
     ("warmup_s", None), ("evictions", None), ("hit_rate", None)],
)
def test_each_figure_knows_which_direction_is_better(figure, better):
    assert direction(figure) == better


def test_ratios_say_how_many_times_better_than_the_reference():
    figures = {
        "reference": {"pool_s": 4.0, "ops_per_s": 10.0, "evictions": 7, "warmup_s": 0.1},
        "fast": {"pool_s": 0.5, "ops_per_s": 300.0, "evictions": 7, "warmup_s": 9.0},
    }
    assert ratios(figures) == {"fast": {"pool_s": 8.0, "ops_per_s": 30.0}}
    assert ratios({"fast": {"pool_s": 1.0}}) == {}


def _results(pair_us: float, speedup: float) -> dict:
    return {"micro": {"fast": {"alloc_free_1_pair_us": pair_us}},
            "ratios": {"micro": {"fast": {"alloc_free_64_blocks_per_s": speedup}}}}


def test_targets_are_met_missed_or_not_measured():
    by_figure = {t.figure: t for t in TARGETS}
    pair, alloc = by_figure["alloc_free_1_pair_us"], by_figure["alloc_free_64_blocks_per_s"]
    assert pair.evaluate(_results(0.8, 40), quick=False)["met"] is True
    assert pair.evaluate(_results(1.2, 40), quick=False)["met"] is False
    assert alloc.evaluate(_results(0.8, 29.9), quick=False)["met"] is False
    assert alloc.evaluate(_results(0.8, 30), quick=False)["met"] is True
    assert alloc.evaluate(_results(0.8, 30), quick=True)["met"] is None
    assert Target("x", "trace", "pool_s", 1, "max").evaluate({}, quick=False)["met"] is None


def test_the_documented_targets_are_all_there():
    assert {(t.suite, t.figure, t.goal) for t in TARGETS} == {
        ("trace", "pool_s", 20),
        ("construct", "construct_1M_s", 0.010),
        ("construct", "construct_1M_bytes_per_block", 64),
        ("micro", "alloc_free_64_blocks_per_s", 30),
        ("micro", "alloc_free_1_pair_us", 1.0),
    }


def test_units_are_readable():
    assert format_value("x_per_s", 2_500_000) == "2.50M/s"
    assert format_value("pool_s", 0.0123) == "12.30 ms"
    assert format_value("hit_rate", 0.5) == "50.00%"
    assert size_label(1_000_000) == "1M" and size_label(100_000) == "100k"
