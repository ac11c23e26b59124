"""The recovery verdict: recovered, not recovered, unknown, pending; gaps and NaN never count as good,
and not recovered only on complete evidence (a truth table over the ways evidence goes missing)."""
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


def test_gap_breaks_the_stretch_and_the_verdict_is_unknown():
    """Two good stretches of 40 s separated by a 30 s gap do not add up to 60 s; but the hold may have
    been met in the unseen 30 s, so the window does not prove the opposite either: unknown."""
    samples = _every(1000, 1040, 5, 100) + _every(1070, 1110, 5, 100) + _every(1115, 1180, 5, 900)
    verdict = judge_recovery(samples, acted_at=1000, now=1180, condition=COND)
    assert verdict.state is Recovery.UNKNOWN
    assert "not seen from 1040 to 1070" in verdict.reason


def test_nan_is_not_good_and_samples_before_the_action_do_not_count():
    """NaN breaks a stretch (never recovered through it) and proves nothing bad (unknown); good
    samples from before the action are ignored."""
    before = _every(900, 999, 5, 100)
    samples = before + _every(1000, 1040, 5, 100) + [(1045, math.nan)] + _every(1050, 1090, 5, 100)
    samples += _every(1095, 1180, 5, 900)
    verdict = judge_recovery(samples, acted_at=1000, now=1180, condition=COND)
    assert verdict.state is Recovery.UNKNOWN
    broken_by_a_bad_sample = [(t, 900.0 if t == 1045 else v) for t, v in samples]
    verdict = judge_recovery(broken_by_a_bad_sample, acted_at=1000, now=1180, condition=COND)
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
                                    {"below": 1.0, "hold_seconds": 200, "within_seconds": 100},
                                    {"below": 1.0, "max_gap_seconds": 0}])
def test_bad_conditions_are_refused(kwargs):
    """Exactly one side, and hold no longer than the window."""
    with pytest.raises(ValueError):
        RecoveryCondition(**kwargs)


# ---- the truth table: which evidence proves "not recovered" ---------------------------------------
# COND: below 500, hold 60 s, within 180 s (window 1000..1180), gaps over 20 s unseen, 4 samples needed.
GOOD, BAD = 100.0, 900.0
_TRUTH = [
    # (case, samples, now, verdict)
    ("no sample at all", [], 1180, Recovery.UNKNOWN),
    ("window open, good for 30 s", _every(1010, 1040, 5, GOOD), 1040, Recovery.PENDING),
    ("window open, bad so far: never judged early", _every(1000, 1100, 5, BAD), 1100, Recovery.PENDING),
    ("good for the hold, window still open", _every(1000, 1060, 5, GOOD), 1060, Recovery.RECOVERED),
    ("bad to the end, every 5 s", _every(1000, 1180, 5, BAD), 1180, Recovery.NOT_RECOVERED),
    ("one good sample, then an outage to the end", [(1005, GOOD)], 1180, Recovery.UNKNOWN),
    ("bad, then an outage of 130 s", _every(1000, 1050, 5, BAD), 1180, Recovery.UNKNOWN),
    ("bad, then silent for the last 80 s", _every(1000, 1100, 5, BAD), 1180, Recovery.UNKNOWN),
    ("bad, then silent for the last 30 s (no hold fits)", _every(1000, 1150, 5, BAD), 1180, Recovery.NOT_RECOVERED),
    ("silent for the first 70 s, then bad", _every(1070, 1180, 5, BAD), 1180, Recovery.UNKNOWN),
    ("a 50 s gap between bad samples (no hold fits)", _every(1000, 1050, 5, BAD) + _every(1100, 1180, 5, BAD),
     1180, Recovery.NOT_RECOVERED),
    ("a 70 s gap between bad samples", _every(1000, 1050, 5, BAD) + _every(1120, 1180, 5, BAD), 1180,
     Recovery.UNKNOWN),
    ("good 40 s, a 30 s gap, good 40 s, then bad", _every(1000, 1040, 5, GOOD) + _every(1070, 1110, 5, GOOD)
     + _every(1115, 1180, 5, BAD), 1180, Recovery.UNKNOWN),
    ("good 40 s, one bad sample, good 40 s, then bad", _every(1000, 1040, 5, GOOD) + [(1045, BAD)]
     + _every(1050, 1090, 5, GOOD) + _every(1095, 1180, 5, BAD), 1180, Recovery.NOT_RECOVERED),
    ("a missed poll (10 s) inside a bad stretch", [p for p in _every(1000, 1180, 5, BAD) if p[0] != 1100], 1180,
     Recovery.NOT_RECOVERED),
    ("NaN inside a long good stretch", _every(1000, 1040, 5, GOOD) + [(1045, math.nan)]
     + _every(1050, 1090, 5, GOOD) + _every(1095, 1180, 5, BAD), 1180, Recovery.UNKNOWN),
    ("NaN among bad samples", [(t, math.nan if t == 1100 else v) for t, v in _every(1000, 1180, 5, BAD)], 1180,
     Recovery.NOT_RECOVERED),
    ("three bad samples, fewer than the hold needs", [(1050, BAD), (1100, BAD), (1150, BAD)], 1180,
     Recovery.UNKNOWN),
    ("only NaN", _every(1000, 1180, 5, math.nan), 1180, Recovery.UNKNOWN),
    ("recovery completing after the deadline", _every(1005, 1150, 5, BAD) + _every(1155, 1300, 5, GOOD), 1300,
     Recovery.NOT_RECOVERED),
]


@pytest.mark.parametrize("samples, now, expected", [case[1:] for case in _TRUTH], ids=[case[0] for case in _TRUTH])
def test_truth_table(samples: list[tuple[float, float]], now: float, expected: Recovery):
    """Not recovered only when every stretch a hold fits in was seen or broken by a bad sample and
    enough samples were read; every other closed window without a recovery is unknown."""
    assert judge_recovery(samples, acted_at=1000, now=now, condition=COND).state is expected


def test_unknown_says_what_was_missing():
    """The reason names the unseen stretch, or the samples the hold needed."""
    outage = judge_recovery([(1005, GOOD)], acted_at=1000, now=1180, condition=COND)
    assert outage.reason.startswith("1 sample(s) with a value in the 180s window; a hold of 60s needs at least 4")
    gap = judge_recovery(_every(1000, 1050, 5, BAD) + _every(1120, 1180, 5, BAD), acted_at=1000, now=1180,
                         condition=COND)
    assert gap.reason.startswith("not seen from 1050 to 1120 (70s without a sample or with no value)")


def test_samples_needed_follows_the_hold_and_the_gap():
    """A hold of 60 s seen at most 20 s apart needs 4 samples; a hold of 0 s needs one."""
    assert COND.samples_needed == 4
    assert RecoveryCondition(below=1.0, hold_seconds=0, within_seconds=10, max_gap_seconds=3).samples_needed == 1
    assert RecoveryCondition(below=1.0, hold_seconds=2, within_seconds=8, max_gap_seconds=2.5).samples_needed == 2
