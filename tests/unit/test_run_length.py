"""The Markov-chain run length and the thresholds derived from a stated rate, against simulation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from detectors.sequential.design import BankDesign
from detectors.sequential.run_length import run_length, threshold_for
from detectors.sequential.thresholds import Promise, rounded_traffic, thresholds


def _simulated_run_length(h, jump, drain, mean, rows=4000, steps=60_000, seed=7):
    """Mean steps between alarms of S = max(0, S + jump c - drain), restarted at each alarm."""
    rng = np.random.default_rng(seed)
    s, alarms = np.zeros(rows), 0
    for _ in range(steps):
        s = np.maximum(0.0, s + rng.poisson(mean, rows) * jump - drain)
        hit = s >= h
        alarms += int(hit.sum())
        s[hit] = 0.0
    return rows * steps / alarms


@pytest.mark.slow  # thousands of simulated steps per case
@pytest.mark.parametrize("ratio,requests", [(4.0, 40.0), (10.0, 4.0), (200.0, 40.0)])
def test_run_length_matches_simulation(ratio, requests):
    null = 0.0005
    jump, drain, mean = math.log(ratio), requests * null * (ratio - 1), requests * null
    h = threshold_for(3_000, jump, drain, mean)
    simulated = _simulated_run_length(h, jump, drain, mean)
    # The threshold gives at least the run length asked for (sampling error ~5%), not far more.
    assert simulated >= 0.9 * 3_000
    assert run_length(h, jump, drain, mean) == pytest.approx(simulated, rel=0.35)


def test_thresholds_grow_with_traffic_and_days():
    design = BankDesign.for_budget(0.001)
    month = Promise(days=30, step_seconds=1.0)
    quiet, busy = thresholds(design, month, 4.0), thresholds(design, month, 400.0)
    assert all(q < b for q, b in zip(quiet[:3], busy[:3]))  # more requests: more chances to cluster
    week = thresholds(design, Promise(days=7, step_seconds=1.0), 40.0)
    assert all(w < m for w, m in zip(week, thresholds(design, month, 40.0)))


def test_traffic_is_rounded_up():
    for value in (0.37, 4.0, 41.3, 999.0):
        rounded = rounded_traffic(value)
        assert value <= rounded < value * 1.0501
    assert rounded_traffic(0.0) == 0.0 and rounded_traffic(float("nan")) == 0.0


def test_no_traffic_needs_no_more_than_one_jump():
    assert threshold_for(1e6, math.log(4.0), 0.0, 0.0) == math.log(4.0)


def test_run_length_over_steps_whose_requests_vary_matches_simulation():
    """A member that crosses on one step's count (its drain a few jumps) crosses far more often on
    steps with fewer requests than the mean: its run length solved over Poisson requests a step
    matches a simulation of such steps, and the fixed-traffic chain overstates it."""
    ratio, null, requests, h = 10.0, 0.005, 100.0, 3.0
    jump, drain, mean = math.log(ratio), requests * null * (ratio - 1), requests * null
    rng = np.random.default_rng(8)
    rows, steps = 4000, 6000
    s, alarms = np.zeros(rows), 0
    for _ in range(steps):
        n = rng.poisson(requests, rows)
        s = np.maximum(0.0, s + rng.poisson(null * n) * jump - drain * n / requests)
        hit = s >= h
        alarms += int(hit.sum())
        s[hit] = 0.0
    simulated = rows * steps / alarms
    varying = run_length(h, jump, drain, mean, requests=requests)
    assert varying == pytest.approx(simulated, rel=0.15)
    assert run_length(h, jump, drain, mean) > 1.3 * simulated
