"""The limit on counters' steps (evaluation/operating_curve/step_limit.py): its run length is the
CUSUM's (a Monte Carlo of the statistic agrees with the chain), its threshold keeps the promise, and
it sees no more than whether a step holds a slow request."""
from __future__ import annotations

import math

import numpy as np

from detectors.sequential.thresholds import Promise
from evaluation.operating_curve.arrivals import Steps
from evaluation.operating_curve.step_limit import StepLimit, run_length, step_rates, step_threshold


def test_the_chain_run_length_is_the_cusums() -> None:
    p0, p1 = step_rates(0.0005, 0.005, 40.0)
    h = 4.0
    rng = np.random.default_rng(1)
    rows = 4000
    s, first = np.zeros(rows), np.full(rows, -1)
    up, down = math.log(p1 / p0), math.log((1 - p1) / (1 - p0))
    for c in range(20_000):
        s = np.maximum(s + np.where(rng.random(rows) < p0, up, down), 0.0)
        new = (s >= h) & (first < 0)
        first[new] = c + 1
        s[s >= h] = -1e9  # done
    assert (first > 0).all()
    mc = first.mean()
    assert abs(run_length(h, p0, p1) - mc) < 4 * first.std() / math.sqrt(rows)


def test_the_threshold_meets_the_promise_and_no_lower_one_does() -> None:
    promise = Promise(30.0, 1.0)
    h = step_threshold(0.0005, 0.005, promise.steps, 40.0)
    p0, p1 = step_rates(0.0005, 0.005, 40.0)
    assert run_length(h, p0, p1) >= promise.steps > run_length(h - 0.05, p0, p1)


def test_two_slow_requests_in_a_step_weigh_as_one() -> None:
    limit = StepLimit(0.0005, 0.005, Promise(30.0, 1.0), 40.0)
    requests = np.full((2, 30), 40.0)
    above = np.zeros((2, 30))
    above[0, ::3] = 1.0
    above[1, ::3] = 3.0  # three in each of the same steps: the same evidence on counters
    run = limit.start(2)
    run.feed(Steps(requests, above, requests))
    assert run.first[0] == run.first[1] and math.isfinite(run.first[0])
