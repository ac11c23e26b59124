"""Benchmark options and counts that the docs quote: the operating curve's --traffic levels, and
where the Mann-Whitney judge spends its false verdicts."""
from __future__ import annotations

import pytest

from bench.bench_operating_curve import TRAFFIC, traffic_levels
from evaluation.operating_curve.kayenta import young_verdicts
from evaluation.operating_curve.pairs import Split


def test_traffic_levels_pick_in_the_benchmarks_order_and_refuse_unknown_names() -> None:
    assert traffic_levels(None) == TRAFFIC
    picked = traffic_levels("diurnal, 40")
    assert [t.mean for t in picked] == [40.0, 40.0] and picked[0].swing == 0 and picked[1].swing > 0
    with pytest.raises(SystemExit, match="unknown level"):
        traffic_levels("41")
    with pytest.raises(SystemExit, match="none given"):
        traffic_levels(",")


def test_young_verdicts_count_first_verdicts_near_the_canarys_start() -> None:
    split = Split(400.0, 0.01)
    young, total = young_verdicts(split, 20, alpha=0.5)  # an alpha that fires often, early and late
    assert 0 < young <= 20 <= total
    none_young, _ = young_verdicts(split, 20, alpha=0.5, young_seconds=0.0)
    assert none_young == 0
