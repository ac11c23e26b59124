"""The canary judge's start test: a young canary (its whole life in the lookback) is judged on its
life against a bound that holds over every look, at the probability it states; an old one with the
same recent evidence waits for the running bank."""
from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

import detectors.canary_start as canary_start
from core.query import Series
from detectors.canary import TailCanaryDetector, canary_design
from detectors.canary_start import (HORIZON_GRID, TOLERANCE, crossing_probability, life_start, start_alpha,
                                    start_cell, start_thresholds, ville_thresholds)
from detectors.sequential.thresholds import STORE, TRAFFIC_GRID, rounded_traffic
from detectors.tail_excess import TailExcessParams
from tests.unit.test_canary_judge import DR, START, Cluster, _vs

DESIGN = TailExcessParams(line=500.0, evidence="histogram").test().design


@pytest.mark.parametrize("requests_per_step", [0.4, 4.0, 40.0])
def test_the_bound_is_tight_below_the_ville_bound(requests_per_step: float) -> None:
    alpha = start_alpha(30.0)
    (h, *rest) = start_thresholds(DESIGN, alpha, requests_per_step, 900)
    assert all(v == h for v in rest) and h < ville_thresholds(DESIGN, alpha)[0]
    assert crossing_probability(DESIGN, h, requests_per_step, 900) <= alpha
    assert crossing_probability(DESIGN, h - 0.3, requests_per_step, 900) > alpha


def test_the_crossing_probability_is_what_null_canaries_show() -> None:
    """Monte Carlo of canaries at the null (4 requests a step, Poisson units above the line): the
    share whose life statistic reaches the bound at some member within 900 steps."""
    rng = np.random.default_rng(7)
    n, steps, paths, bound = 4.0, 900, 40_000, 2.5
    requests = n * np.arange(1, steps + 1)
    crossed = 0
    for _ in range(paths // 5_000):  # 5,000 paths at a time: a few tens of MB
        units = np.cumsum(rng.poisson(DESIGN.null * n, (5_000, steps)), axis=1)
        hit = np.zeros(5_000, dtype=bool)
        for jump, drain in zip(DESIGN.jumps, DESIGN.drains):
            hit |= (units * jump - requests * drain >= bound).any(axis=1)
        crossed += int(hit.sum())
    expected = crossing_probability(DESIGN, bound, n, steps)
    seen = crossed / paths
    assert abs(seen - expected) < 4 * np.sqrt(expected * (1 - expected) / paths) + 1e-3, (seen, expected)


def test_a_start_is_a_first_request_after_the_stable_served_enough_alone() -> None:
    stable = np.full(100, 36.0)
    canary = np.r_[np.full(60, np.nan), np.full(40, 4.0)]
    assert life_start(canary, stable, 0.1) == 60
    assert life_start(np.full(100, 4.0), stable, 0.1) is None  # serving from the lookback's start
    slow = np.r_[np.full(3, np.nan), np.full(97, 0.4)]  # a gap a 1% canary can have
    assert life_start(slow, np.full(100, 39.6), 0.01) is None
    assert life_start(canary, stable, 0.0) is None


def _series(share: float, per_s: float, version: str, begin: int, seconds: int,
            onset: int = 0) -> tuple[Series, Series]:
    """A version's histogram (bucket at the line, count) served from `begin` to `seconds`, its share
    above the line from `onset` on (none before), spread evenly: every (1 / share)-th request."""
    t = np.arange(begin, seconds)
    requests = np.full(t.size, per_s)
    served = np.cumsum(np.where(t >= onset, requests, 0.0))
    above = np.diff(np.floor(served * share + 0.5), prepend=0.0)
    ts = tuple(START + np.r_[begin, t + 1].astype(float))
    labels = {"model": "ranker", "version": version}
    bucket = np.r_[0.0, np.cumsum(requests - above)]
    count = np.r_[0.0, np.cumsum(requests)]
    return (Series({"__name__": "b", **labels, "le": "500.0"}, ts, tuple(bucket)),
            Series({"__name__": "c", **labels}, ts, tuple(count)))


def _verdict(canary: tuple[Series, Series]):
    det = TailCanaryDetector({"line": 500, "evidence": "histogram",
                              "virtualService": {"namespace": "serving", "name": "ranker"}})
    asyncio.run(det.observe_cluster(Cluster({"virtualservices": _vs({"v1": 90, "v2": 10}), "destinationrules": DR})))
    stable = _series(0.0005, 36.0, "1", 0, 900)
    now = stable[0].timestamps[-1]
    det.detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])
    assert STORE.wait()
    return det.detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])[1]


@pytest.mark.slow  # derives the thresholds of the canary's bank
def test_a_young_canary_is_judged_on_its_life_and_an_old_one_waits_for_the_bank() -> None:
    young = _verdict(_series(0.005, 4.0, "2", 600, 900))
    # The verdict reads as every canary verdict does (the lab's log is matched on it), the start after.
    assert young.fired and young.reason.startswith("canary worse than the stable: canary v2"), young.reason
    assert "since its first request" in young.reason
    began = young.details["start_test"]["began"]
    assert young.details["start_test"]["fired"] and young.episode_start == began and START + 600 < began <= START + 601
    # The same five minutes of the defect on a canary that served, healthy, since before the lookback.
    old = _verdict(_series(0.005, 4.0, "2", 0, 900, onset=600))
    assert "start_test" not in old.details and not old.fired, old.reason


@pytest.mark.slow  # derives the thresholds of the canary's bank
def test_a_young_healthy_canary_passes_the_start_test() -> None:
    young = _verdict(_series(0.0005, 4.0, "2", 600, 900))
    assert not young.fired and not young.details["start_test"]["fired"], young.reason


def _exact(design: Any, alpha: float, n: float, steps: int) -> float:
    """The least bound at exactly this traffic and horizon (the bisection without a cell), to TOLERANCE."""
    lo, hi = 0.0, max(ville_thresholds(design, alpha))
    while hi - lo > TOLERANCE / 4:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if crossing_probability(design, mid, n, steps) > alpha else (lo, mid)
    return hi


@pytest.mark.parametrize(("step", "edge", "steps"), [(0, 1.0001, 900), (0, 1.00001, 901), (3, 1.005, 1800),
                                                     (10, 1.0001, 3601)])
@pytest.mark.parametrize("cell_top", [0.4, 4.0, 40.0])
def test_the_rounded_cell_is_at_least_as_conservative_as_every_traffic_and_horizon_in_it(
        step: int, edge: float, steps: int, cell_top: float) -> None:
    """The live bound is its cell's (traffic on the 1% grid, horizon on HORIZON_GRID): at the bottom
    of the traffic cell (where rounding the traffic up alone would let the lattice of counts cross
    more often than assumed), in its middle and at its top, and at a horizon just past a cell's
    start, it is no lower than the exact least bound and its crossing probability stays within alpha."""
    alpha = start_alpha(30.0)
    design = canary_design(DESIGN, step)
    top = rounded_traffic(cell_top)
    (h, *rest) = start_thresholds(design, alpha, top, steps)
    assert all(v == h for v in rest) and h < ville_thresholds(design, alpha)[0]
    for n in (top / TRAFFIC_GRID * edge, top / TRAFFIC_GRID ** 0.5, top):
        assert start_cell(n, steps) == start_cell(top, steps)
        assert start_thresholds(design, alpha, n, steps) == (h, *rest)  # one cell, one computation
        assert crossing_probability(design, h, n, steps) <= alpha
        assert h >= _exact(design, alpha, n, steps) - TOLERANCE / 4
    horizon_top = int(np.ceil(HORIZON_GRID ** start_cell(top, steps)[1] - 1e-6))
    assert steps <= horizon_top < steps * HORIZON_GRID and crossing_probability(design, h, top, horizon_top) <= alpha
    assert h - _exact(design, alpha, top, steps) < 0.3  # what the cell costs here (measured: 0.03-0.11 nats)


@pytest.mark.slow  # derives the thresholds of the canary's bank
def test_the_judge_never_derives_a_missing_start_bound_on_the_caller_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A young canary whose start cell is not derived: the cycle answers at once with Ville's bound
    and says the start bound is being derived, while the store's worker (held until the cycle has
    returned) derives it; the next cycle after it reads the derived bound. Calls of the expensive
    recursion are counted by thread, not timed."""
    real = canary_start.crossing_probability
    on_caller: list[bool] = []
    release = threading.Event()

    def counted(*args: Any, **kwargs: Any) -> float:
        on_caller.append(threading.current_thread() is threading.main_thread())
        if not on_caller[-1]:  # the worker waits for the cycle to return (a regression fails, never hangs)
            release.wait(120.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(canary_start, "crossing_probability", counted)
    det = TailCanaryDetector({"line": 500, "evidence": "histogram", "start_false_verdicts": 0.000987,  # a cell no other test derives
                              "virtualService": {"namespace": "serving", "name": "ranker"}})
    asyncio.run(det.observe_cluster(Cluster({"virtualservices": _vs({"v1": 90, "v2": 10}), "destinationrules": DR})))
    stable, canary = _series(0.0005, 36.0, "1", 0, 900), _series(0.005, 4.0, "2", 600, 900)
    now = stable[0].timestamps[-1]
    try:
        first = det.detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])[1]
    finally:
        release.set()
    start = first.details["start_test"]
    assert not start["derived"] and "start bound being derived" in first.reason, first.reason
    assert list(start["thresholds"].values()) == list(ville_thresholds(canary_design(DESIGN, 0), 0.000987))
    assert not any(on_caller)
    assert STORE.wait()
    second = det.detect_many([stable[0], canary[0]], now, [stable[1], canary[1]])[1]
    assert second.details["start_test"]["derived"] and "being derived" not in second.reason
    assert on_caller and not any(on_caller)  # derived, and only by the worker
    assert second.fired and second.details["start_test"]["fired"], second.reason
