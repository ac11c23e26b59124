"""The canary judge's lookback grows for slow canaries (tail_excess's rule at the canary's traffic),
the live detector evaluates and reports it, the start test's bound holds over it, and the replay
follows the same rule."""
from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from detectors.canary import TailCanaryDetector, canary_design, canary_lookback, reference_step
from detectors.canary_start import bank_days, start_alpha, start_thresholds
from detectors.sequential.thresholds import STORE, Promise, rounded_traffic
from detectors.tail_excess import LOOKBACK_DELAYS, TailExcessParams, lookback_at
from evaluation.operating_curve.canary_judge import Judge
from evaluation.operating_curve.pairs import HALF_BUDGET, Case, Split, seeded_pair
from tests.unit.test_canary_judge import DR, Cluster, _vs
from tests.unit.test_canary_start import _series

PARAMS = TailExcessParams(line=500.0, evidence="histogram")
DESIGN = PARAMS.test().design
ALPHA = start_alpha(30.0)
BANK = Promise(bank_days(30.0, ALPHA), 1.0)


def _h(requests_per_step: float) -> float:
    return STORE.derive_now(DESIGN, BANK, requests_per_step)[0]


def test_the_rule_is_three_expected_delays_in_doublings_of_the_least() -> None:
    r = DESIGN.ratios[0]
    drift = 4.0 * DESIGN.null * (r * math.log(r) - r + 1.0)
    needed = LOOKBACK_DELAYS * 13.0 / drift  # 7,660 s at 4 requests a step
    got = lookback_at(900.0, 1e6, DESIGN, 4.0, 13.0, 1.0)
    assert got == 900.0 * 2 ** math.ceil(math.log2(needed / 900.0)) and got / 2 < needed <= got
    assert lookback_at(900.0, 7200.0, DESIGN, 4.0, 13.0, 1.0) == 7200.0  # capped
    assert lookback_at(900.0, 7200.0, DESIGN, 400.0, 13.0, 1.0) == 900.0  # never below the least


def test_a_slow_canary_gets_a_longer_lookback_a_fast_one_the_least() -> None:
    slow = canary_lookback(PARAMS, 1.0, 1.0, _h(1.0))  # 1% of 40 req/s: one request per scored step
    assert slow == PARAMS.max_lookback_seconds
    assert canary_lookback(PARAMS, 40.0, 1.0, _h(40.0)) == PARAMS.lookback_seconds_  # 10% of 400 req/s
    capped = TailExcessParams(line=500.0, evidence="histogram", max_lookback_seconds=1800.0)
    assert canary_lookback(capped, 1.0, 1.0, _h(1.0)) == 1800.0
    assert canary_lookback(PARAMS, 0.05, 1.0, _h(0.05)) == PARAMS.lookback_seconds_  # below SLOWEST_COUNTED


def _detector() -> TailCanaryDetector:
    det = TailCanaryDetector({"line": 500, "evidence": "histogram",
                              "virtualService": {"namespace": "serving", "name": "ranker"}})
    asyncio.run(det.observe_cluster(Cluster({"virtualservices": _vs({"v1": 99, "v2": 1}), "destinationrules": DR})))
    return det


def test_the_live_detector_reports_and_then_evaluates_the_grown_lookback() -> None:
    """A 1% canary at 0.4 req/s beside a stable at 39.6: the first cycle reads the least lookback
    and reports the grown one; the next cycle's window is the grown one (the poller asks for it)."""
    seconds = 4000
    stable, canary = _series(0.0005, 39.6, "1", 0, seconds), _series(0.0005, 0.4, "2", 0, seconds)
    now = stable[0].timestamps[-1]
    det = _detector()
    assert det.lookback_seconds == 900.0
    first = det.detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])[1]
    assert det.lookback_seconds == PARAMS.max_lookback_seconds
    assert first.details["canary_requests"] == pytest.approx(0.4 * 900, abs=1.0)
    second = det.detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])[1]
    assert second.details["canary_requests"] == pytest.approx(0.4 * seconds, abs=1.0)  # all 4,000 s
    assert det.lookback_seconds == PARAMS.max_lookback_seconds


@pytest.mark.slow  # derives the thresholds of the canary's bank (the Wald bound would grow it too)
def test_a_fast_canary_keeps_the_least_lookback() -> None:
    det = TailCanaryDetector({"line": 500, "evidence": "histogram",
                              "virtualService": {"namespace": "serving", "name": "ranker"}})
    asyncio.run(det.observe_cluster(Cluster({"virtualservices": _vs({"v1": 90, "v2": 10}), "destinationrules": DR})))
    stable, canary = _series(0.0005, 360.0, "1", 0, 900), _series(0.0005, 40.0, "2", 0, 900)
    now = stable[0].timestamps[-1]
    det.detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])
    assert STORE.wait()
    det.detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])
    assert det.lookback_seconds == 900.0


def test_the_start_bound_holds_over_the_grown_horizon() -> None:
    """A young 1% canary (its life in the lookback): its start bound is the one over the grown
    lookback's 7,200 steps, not over the 900 of the window it was first read in."""
    stable = _series(0.0005, 39.6, "1", 0, 900)
    canary = _series(0.0005, 0.4, "2", 600, 900)
    now = stable[0].timestamps[-1]
    _detector().detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])  # queues the bound's cell
    assert STORE.wait()
    d = _detector().detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])[1]
    start = d.details["start_test"]
    assert start["horizon_steps"] == 7200 and start["derived"]
    design = canary_design(DESIGN, reference_step(d.details["reference"], DESIGN.null))
    traffic = rounded_traffic(d.details["assumed"]["requests_per_second"])
    grown = start_thresholds(design, ALPHA, traffic, 7200)
    assert list(start["thresholds"].values()) == pytest.approx(list(grown))
    assert grown[0] > start_thresholds(design, ALPHA, traffic, 901)[0] + 0.3  # the test can tell them apart


def test_the_replay_follows_the_live_rule() -> None:
    """The replay's lookback is set from the canary's requests per scored step in the first chunk,
    by the live rule; a `lookback_seconds` given wins."""
    healthy = Case("healthy canary", "healthy", HALF_BUDGET, HALF_BUDGET)
    for split, width in ((Split(40.0, 0.01), 7200), (Split(400.0, 0.1), 900)):
        pair = seeded_pair(1, split, healthy, 600.0, 900.0, 500.0)
        run = Judge(PARAMS, 1.0, weight=split.weight).start(1)
        run._begin(pair)  # what the first feed does before it judges
        traffic = float(np.nanmean(pair.canary.requests))
        assert run.width == width == round(canary_lookback(PARAMS, traffic, 1.0, _h(traffic)))
        assert [t.shape for t in run.tails] == [(1, width)] * 4
    fixed = Judge(PARAMS, 1.0, lookback_seconds=900.0, weight=0.01).start(1)
    fixed._begin(seeded_pair(1, Split(40.0, 0.01), healthy, 600.0, 900.0, 500.0))
    assert fixed.width == 900
