"""tail_excess evaluates over the lookback it reported: a slow model's grown lookback is what the
poller fetches and what the next cycle scores, so a regression whose evidence needs more than the
least lookback is decided (the operating-curve benchmark models the same window)."""
from __future__ import annotations

from detectors.tail_excess import TailExcessDetector
from tests.unit.test_canary_start import _series


def _detector() -> TailExcessDetector:
    return TailExcessDetector({"line": 500, "evidence": "histogram"})


def test_the_next_cycle_scores_the_grown_lookback() -> None:
    bucket, count = _series(0.0005, 1.0, "2", 0, 4000)
    now = bucket.timestamps[-1]
    det = _detector()
    first = det.detect_many([bucket], now, [count])[0]
    assert first.details["scored_steps"] == 900 and det.lookback_seconds == 7200.0
    second = det.detect_many([bucket], now, [count])[0]
    assert second.details["scored_steps"] == 4000  # all the data there is, under the grown lookback
    assert second.details["window_requests"] > 4 * first.details["window_requests"]


def test_a_slow_models_regression_is_decided_once_the_window_has_grown() -> None:
    # 0.4% of 1 req/s above the line for 4,000 s: 4 slow requests in the least lookback, short of
    # every member's threshold; 16 over the whole range, past it.
    bucket, count = _series(0.004, 1.0, "2", 0, 4000)
    now = bucket.timestamps[-1]
    det = _detector()
    assert not det.detect_many([bucket], now, [count])[0].fired
    assert det.detect_many([bucket], now, [count])[0].fired
