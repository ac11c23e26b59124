"""The recovery verdict: recovered, not recovered, unknown, pending; gaps and NaN never count as good."""
from __future__ import annotations

import math

import pytest

from policies.recovery import Recovery, RecoveryCondition, judge_recovery

COND = RecoveryCondition(below=500.0, hold_seconds=60, within_seconds=180, max_gap_seconds=20)


def _every(start: float, end: float, step: float, value: float) -> list[tuple[float, float]]:
    return [(start + i * step, value) for i in range(int((end - start) / step) + 1)]


def test_condition_held_long_enough_is_recovered():
    """Good values over 60 s inside the window: recovered, with the start of the stretch."""
    samples = _every(1005, 1030, 5, 900) + _every(1035, 1100, 5, 200)
    verdict = judge_recovery(samples, acted_at=1000, now=1100, condition=COND)
    assert verdict.state is Recovery.RECOVERED
    assert verdict.held_from == 1035


def test_window_closing_while_still_bad_is_not_recovered():
    """Bad values to the end of the window: not recovered, naming the last bad value."""
    samples = _every(1005, 1180, 5, 900)
    verdict = judge_recovery(samples, acted_at=1000, now=1180, condition=COND)
    assert verdict.state is Recovery.NOT_RECOVERED
    assert "900" in verdict.reason


def test_no_data_is_unknown_not_recovered():
    """No sample at all in the window: unknown (never success)."""
    verdict = judge_recovery([], acted_at=1000, now=1200, condition=COND)
    assert verdict.state is Recovery.UNKNOWN


def test_open_window_is_pending():
    """Good for only 30 s so far, window still open: pending."""
    verdict = judge_recovery(_every(1010, 1040, 5, 100), acted_at=1000, now=1040, condition=COND)
    assert verdict.state is Recovery.PENDING


def test_gap_breaks_the_stretch():
    """Two good stretches of 40 s separated by a 30 s gap do not add up to 60 s."""
    samples = _every(1000, 1040, 5, 100) + _every(1070, 1110, 5, 100)
    verdict = judge_recovery(samples, acted_at=1000, now=1180, condition=COND)
    assert verdict.state is Recovery.NOT_RECOVERED


def test_nan_is_not_good_and_samples_before_the_action_do_not_count():
    """NaN breaks a stretch; good samples from before the action are ignored."""
    before = _every(900, 999, 5, 100)
    samples = before + _every(1000, 1040, 5, 100) + [(1045, math.nan)] + _every(1050, 1090, 5, 100)
    verdict = judge_recovery(samples, acted_at=1000, now=1180, condition=COND)
    assert verdict.state is Recovery.NOT_RECOVERED


def test_stretch_must_complete_inside_the_window():
    """Recovery that only completes after the deadline is not recovery within it."""
    samples = _every(1005, 1150, 5, 900) + _every(1155, 1300, 5, 100)
    verdict = judge_recovery(samples, acted_at=1000, now=1300, condition=COND)
    assert verdict.state is Recovery.NOT_RECOVERED


def test_above_condition():
    """`above` works the other way round (throughput back above a floor)."""
    cond = RecoveryCondition(above=10.0, hold_seconds=10, within_seconds=60, max_gap_seconds=10)
    verdict = judge_recovery(_every(1000, 1015, 5, 12), acted_at=1000, now=1015, condition=cond)
    assert verdict.state is Recovery.RECOVERED


@pytest.mark.parametrize("kwargs", [{}, {"below": 1.0, "above": 2.0},
                                    {"below": 1.0, "hold_seconds": 200, "within_seconds": 100}])
def test_bad_conditions_are_refused(kwargs):
    """Exactly one side, and hold no longer than the window."""
    with pytest.raises(ValueError):
        RecoveryCondition(**kwargs)
