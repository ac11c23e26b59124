"""The run length where its chain cannot rise (a busy member made for a large regression, no
traffic): said to be beyond what can be told apart, without solving a singular system; and just
inside the edge, where each step is an independent trial, the chain's answer is 1 / P(crossing)."""
from __future__ import annotations

import math
import warnings

import pytest
from scipy.stats import poisson

from detectors.sequential.run_length import run_length
from detectors.sequential.thresholds import Promise, thresholds
from detectors.tail_excess import TailExcessParams


@pytest.fixture(autouse=True)
def _no_singular_solve():
    # A singular solve warns (MatrixRankWarning) and answers NaN: none of these may take that path.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_a_member_that_cannot_rise_runs_beyond_what_is_told_apart():
    # The count bank's 20x member at 2,000 requests a step: the drain is 98 nats, a count 4.6, and
    # a crossing needs 22 counts in one step where 1 is expected (~1e-21 per step).
    assert run_length(1.75, 4.595, 98.12, 1.011) == math.inf
    assert run_length(1.0, math.log(100.0), 20.0, 0.1) != math.inf  # 5 counts suffice: ~1e-7
    assert run_length(1.0, math.log(100.0), 100.0, 0.1) == math.inf  # 22 counts: ~1e-43
    assert run_length(1.0, math.log(4.0), 0.5, 1e-30) == math.inf  # no traffic to speak of


def test_just_inside_the_edge_each_step_is_a_trial():
    # The drain empties S every step, so the run length is 1 / P(one step's count crosses):
    # 5 x ln(100) - 20 >= 1, 4 x ln(100) - 20 < 0.
    assert run_length(1.0, math.log(100.0), 20.0, 0.1) == pytest.approx(1.0 / poisson.sf(4, 0.1), rel=1e-3)


@pytest.mark.parametrize("requests_per_step", [1000.0, 2000.0, 5000.0])
@pytest.mark.parametrize("evidence", ["counters", "histogram"])
def test_busy_traffic_derives_every_member_without_a_singular_solve(requests_per_step, evidence):
    params = TailExcessParams(line=500, evidence=evidence)
    designs = [params.test().design] + ([d] if (d := params.count_design()) is not None else [])
    for design in designs:
        h = thresholds(design, Promise(days=30, step_seconds=1.0), requests_per_step)
        assert all(math.isfinite(x) and x > 0 for x in h), (design, h)
