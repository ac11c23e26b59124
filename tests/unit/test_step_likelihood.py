"""The per-step (Bernoulli) likelihood of counters counted per step: its rise, the bank's use of
it, and its run length against simulation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from detectors._slow_counts import counting_design
from detectors.sequential.bank import first_alarms, member_increments
from detectors.sequential.design import BankDesign
from detectors.sequential.run_length import run_length, threshold_for
from detectors.sequential.step_likelihood import held_rise
from detectors.sequential.thresholds import Promise, thresholds


def test_a_rare_slow_request_rises_by_a_counts_jump_and_a_common_one_by_less():
    null, ratio = 0.0005, 20.0
    few, many = held_rise(null, ratio, np.array([0.01])), held_rise(null, ratio, np.array([400.0]))
    assert few[0] == pytest.approx(math.log(ratio), rel=1e-3)
    # At 400 requests a 1% regression holds one in almost every step: a held step says little more
    # than the null's 18% of held steps, and the drain it escapes is most of its rise.
    p0, p1 = -math.expm1(-0.2), -math.expm1(-4.0)
    assert many[0] == pytest.approx(math.log(p1 / p0) + 400 * null * (ratio - 1.0))
    assert held_rise(null, ratio, np.array([0.0]))[0] == 0.0


def test_the_bank_reads_a_per_step_design_by_the_steps_bernoulli_likelihood():
    design = counting_design(0.001, 0.5, (2.0, 100.0))
    rng = np.random.default_rng(3)
    requests = rng.poisson(40.0, (3, 200)).astype(np.float64)
    units = np.where(rng.random((3, 200)) < 0.3, 1.3, 0.0)  # a merge-corrected count: held or not
    for k, r in enumerate(design.ratios):
        p0 = -np.expm1(-requests * design.null)
        p1 = -np.expm1(-requests * design.null * r)
        want = np.where(units > 0, np.log(p1 / p0), np.log((1 - p1) / (1 - p0)))
        np.testing.assert_allclose(member_increments(design, k, units, requests), want, rtol=1e-9, atol=1e-12)
    # The vectorised bank fires where Page's recursion on those increments first reaches h.
    h = np.array([6.0, 9.0])
    alarm, _, _ = first_alarms(design, units, requests, h)
    for row in range(3):
        first = -1
        for k in range(2):
            s = 0.0
            for c in range(200):
                s = max(0.0, s + float(member_increments(design, k, units[row:row + 1, c:c + 1],
                                                         requests[row:row + 1, c:c + 1])[0, 0]))
                if s >= h[k]:
                    first = c if first < 0 else min(first, c)
                    break
        assert alarm[row] == first


def test_a_per_step_design_has_the_exact_likelihoods_exponent():
    assert counting_design(0.001, 0.5, (2.0, 5.0)).exponents() == (1.0, 1.0)
    with pytest.raises(ValueError, match="lump 1"):
        BankDesign(0.001, (4.0,), lump=2.0, per_step=True)


def _simulated(h, null, ratio, requests, rows=4000, steps=40_000, seed=11):
    """Mean steps between alarms of the Bernoulli CUSUM on steps of Poisson(requests) requests."""
    rng = np.random.default_rng(seed)
    s, alarms = np.zeros(rows), 0
    for _ in range(steps):
        n = rng.poisson(requests, rows).astype(np.float64)
        p0, p1 = -np.expm1(-n * null), -np.expm1(-n * null * ratio)
        held = rng.random(rows) < p0
        with np.errstate(divide="ignore", invalid="ignore"):
            up = np.where(n > 0, np.log(p1 / p0), 0.0)
        s = np.maximum(0.0, s + np.where(held, up, -n * null * (ratio - 1.0)))
        hit = s >= h
        alarms += int(hit.sum())
        s[hit] = 0.0
    return rows * steps / alarms


@pytest.mark.slow  # 160,000 simulated steps per case
@pytest.mark.parametrize("ratio,requests", [(4.0, 40.0), (40.0, 40.0), (20.0, 400.0)])
def test_per_step_run_length_matches_simulation(ratio, requests):
    """The chain over held steps (their rise depending on the step's requests) against a simulation
    of the live recursion, at a null busy enough for short runs."""
    null = 0.002
    jump, drain, mean = math.log(ratio), requests * null * (ratio - 1), requests * null
    h = threshold_for(2_000, jump, drain, mean, requests=requests, per_step=True)
    simulated = _simulated(h, null, ratio, requests)
    # Each move split between its two neighbouring cells, mean exact: within ~1% of the simulation
    # (sampling error ~0.5%); rounding the held rise to a cell was 6% long at ratio 4, 40 requests.
    assert simulated >= 0.95 * 2_000
    assert run_length(h, jump, drain, mean, requests=requests, per_step=True) == pytest.approx(simulated, rel=0.05)


def test_per_step_thresholds_are_derived_at_every_traffic():
    design = counting_design(0.001, 0.5, (2.0, 5.0, 10.0, 20.0, 50.0, 100.0))
    month = Promise(days=30, step_seconds=1.0)
    for traffic in (2.0, 40.0, 400.0, 1000.0):
        h = thresholds(design, month, traffic)
        assert all(math.isfinite(x) and 5.0 < x < 20.0 for x in h)
