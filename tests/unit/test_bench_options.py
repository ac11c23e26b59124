"""Benchmark options that the docs quote: the operating curve's --traffic levels (where the
Mann-Whitney judge spends its false verdicts is tests/unit/test_bench_canary.py's)."""
from __future__ import annotations

import pytest

from bench.bench_operating_curve import TRAFFIC, traffic_levels


def test_traffic_levels_pick_in_the_benchmarks_order_and_refuse_unknown_names() -> None:
    assert traffic_levels(None) == TRAFFIC
    picked = traffic_levels("diurnal, 40")
    assert [t.mean for t in picked] == [40.0, 40.0] and picked[0].swing == 0 and picked[1].swing > 0
    with pytest.raises(SystemExit, match="unknown level"):
        traffic_levels("41")
    with pytest.raises(SystemExit, match="none given"):
        traffic_levels(",")
