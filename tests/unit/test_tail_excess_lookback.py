"""tail_excess scores the lookback it reported: a slow model's grown lookback is what the poller
fetches and what the next cycle scores, so a regression whose evidence needs more than the least
lookback is decided (the operating-curve benchmark models the same window). What a row shows of
its budget (the alert gate's input) stays the recent window, and the shared-slowdown rule judges
the other versions over the firing one's episode when that is older."""
from __future__ import annotations

from detectors.sequential.acceptance import shown_above
from detectors.tail_excess import TailExcessDetector
from tests.unit.test_canary_start import _series


def _detector() -> TailExcessDetector:
    return TailExcessDetector({"line": 500, "evidence": "histogram"})


def test_the_next_cycle_scores_the_grown_lookback_and_the_budget_window_stays_recent() -> None:
    bucket, count = _series(0.0005, 1.0, "2", 0, 4000)
    now = bucket.timestamps[-1]
    det = _detector()
    first = det.detect_many([bucket], now, [count])[0]
    assert first.details["scored_steps"] == 900 and det.lookback_seconds == 7200.0
    second = det.detect_many([bucket], now, [count])[0]
    assert second.details["scored_steps"] == 4000  # all the data there is, under the grown lookback
    assert second.details["window_requests"] == first.details["window_requests"] == 900
    assert second.budget is not None and second.budget.requests == 900
    assert "over the lookback" in first.reason and "over the last 900 s" in second.reason, second.reason
    # What the test assumed says both windows (`tailguard status` shows it).
    assert (first.details["assumed"]["lookback_seconds"], first.details["assumed"]["budget_window_seconds"]) == (900, 900)
    assert (second.details["assumed"]["lookback_seconds"], second.details["assumed"]["budget_window_seconds"]) == (7200, 900)


def test_a_slow_models_regression_is_decided_once_the_window_has_grown() -> None:
    # 0.4% of 1 req/s above the line for 4,000 s: 4 slow requests in the least lookback, short of
    # every member's threshold; 16 over the whole range, past it.
    bucket, count = _series(0.004, 1.0, "2", 0, 4000)
    now = bucket.timestamps[-1]
    det = _detector()
    assert not det.detect_many([bucket], now, [count])[0].fired
    assert det.detect_many([bucket], now, [count])[0].fired


def _two_versions(other_share: float) -> list:
    # Whole requests per step (the count evidence reads fractional steps as none above the line).
    v2, v2_count = _series(0.003, 2.0, "2", 0, 4000)
    v1, v1_count = _series(other_share, 1.0, "1", 0, 4000)
    now = v2.timestamps[-1]
    det = _detector()
    assert not any(d.fired for d in det.detect_many([v2, v1], now, [v2_count, v1_count]))  # the least lookback
    return det.detect_many([v2, v1], now, [v2_count, v1_count])


def test_a_shared_slowdown_is_judged_over_the_firing_versions_episode() -> None:
    # v1 at half v2's traffic, as slow: 3 slow requests in its last 900 s (not shown above its
    # budget there), 12 over v2's episode (shown above): a shared cause, nothing fires.
    v2, v1 = _two_versions(0.003)
    assert v1.budget is not None and (v1.budget.above, v1.budget.requests) == (3.0, 900.0)
    assert not shown_above(v1.budget.above, v1.budget.requests, v1.budget.allowed)
    assert not v2.fired and v2.reason.startswith("shared slowdown: versions 1, 2"), v2.reason
    assert v2.details["shared_slowdown"] == ["1", "2"]


def test_a_healthy_other_version_leaves_the_defect_to_fire() -> None:
    v2, v1 = _two_versions(0.0)
    assert v2.fired and not v1.fired, v2.reason
