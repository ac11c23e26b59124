"""Where a backtest finds the samples Prometheus stored and how often it stored them."""
from __future__ import annotations

from core.query import Series
from daemon.workers.replay_alerts import densest_window, scrape_interval


def test_the_densest_window_is_the_fullest_count() -> None:
    counts = [Series({"version": "1"}, (60.0, 120.0, 180.0), (3.0, 12.0, 12.0)),
              Series({"version": "2"}, (120.0, 180.0), (0.0, 5.0))]
    assert densest_window(counts) == (120.0, 12.0)
    assert densest_window([Series({}, (60.0,), (0.0,))]) is None


def test_the_interval_is_the_median_gap_between_distinct_sample_times() -> None:
    # timestamp() read every 1.25 s repeats each sample's time until the next scrape; one missed scrape
    stamps = [Series({}, tuple(1.25 * k for k in range(20)),
                     (float("nan"), 5.0, 5.0, 5.0, 5.0, 10.0, 10.0, 10.0, 10.0, 15.0, 15.0, 15.0, 15.0,
                      15.0, 15.0, 15.0, 15.0, 25.0, 25.0, 25.0))]
    assert scrape_interval(stamps) == 5.0
    assert scrape_interval([Series({}, (0.0, 1.0), (5.0, 5.0))]) is None
