"""When a started version's settle ends (detectors/tail_excess_settle.py): with the first step after
the start's that the model load left all but clear, so a deploy that held nothing costs the start
test one step; a hold or a drain keeps it going; a bulk too slow to tell runs it to its longest."""
from __future__ import annotations

import numpy as np

from detectors.tail_excess import TailExcessDetector
from detectors.tail_excess_settle import may_be_held, settle_columns, settle_end
from tests.unit.test_tail_excess_start import PARAMS, _cycles, _version

GRID = np.arange(1000.0, 1011.0)  # the start (first sample above zero) at 1001


def _cumulative(per_step: list[float]) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(per_step)])


def test_a_histogram_step_ends_the_settle_once_under_a_tenth_of_it_is_above_the_line() -> None:
    requests = [40.0] * 10
    above = [30.0, 40.0, 20.0, 4.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # held, then a drain
    below = _cumulative([n - a for n, a in zip(requests, above)])
    end = settle_end(GRID, 1001.0, 5.0, below, _cumulative(requests), "histogram", 500.0)
    assert end == 1005.0  # the step (1004, 1005] holds 3 of 40: the first under a tenth after the start's
    assert settle_end(GRID, 1001.0, 2.0, below, _cumulative(requests), "histogram", 500.0) == 1003.0  # the longest


def test_on_counters_the_mean_must_be_under_a_tenth_of_the_line() -> None:
    requests = _cumulative([40.0] * 10)
    quick = _cumulative([40 * 800.0, 40 * 3.0] + [40 * 3.0] * 8)  # the start's step held, then a 3 ms bulk
    assert settle_end(GRID, 1001.0, 5.0, quick, requests, "counters", 500.0) == 1002.0
    slow_bulk = _cumulative([40 * 800.0] + [40 * 60.0] * 9)  # a 60 ms bulk: fewer than a tenth is unproven
    assert settle_end(GRID, 1001.0, 5.0, slow_bulk, requests, "counters", 500.0) == 1006.0


def test_a_step_without_requests_or_samples_does_not_end_it() -> None:
    d_requests = np.array([[40.0, 0.0, np.nan, 40.0]])
    d_below = np.array([[0.0, 0.0, np.nan, 40.0]])
    held = may_be_held("histogram", 500.0, d_below, d_requests)
    assert held.tolist() == [[True, True, True, False]]
    assert settle_columns(held, 5).tolist() == [3] and settle_columns(held, 2).tolist() == [2]


def test_the_live_start_test_scores_from_the_step_after_the_first_clear_one() -> None:
    v1 = _version("1", 0, 1100, 40.0, 0.0005, 1)
    clean = _version("2", 1000, 1100, 40.0, 0.0005, 2)
    held = _version("2", 1000, 1100, 40.0, 0.0005, 2, held=(3.0, 1.0))
    for v2, settled in ((clean, 1002.0), (held, 1004.0)):
        last = _cycles(TailExcessDetector(PARAMS), [v1, v2], 950, 1100)[-1][1][1]
        start = last.details["start_test"]
        assert start["started_at"] == 1001.0 and start["settled_at"] == settled
        assert f"(settle {settled - 1001.0:g} s" in last.reason
