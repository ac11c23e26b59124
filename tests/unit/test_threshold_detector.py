"""Tests of detectors/threshold.py: static threshold with N-of-M confirmation."""
from __future__ import annotations

import numpy as np
import pydantic
import pytest

from core.detection import RecoveryLine, RecoveryRule, Side
from core.query import Series
from detectors.threshold import ThresholdDetector, ThresholdParams

T0 = 1_700_000_000.0


def series(values: list[float]) -> tuple[Series, float]:
    ts = T0 + 5.0 * np.arange(len(values))
    return Series({}, ts, values), float(ts[-1])


def p999_detector(**kw: object) -> ThresholdDetector:
    return ThresholdDetector({"threshold": 800.0, **kw})


def test_fires_when_three_of_last_five_above():
    """P99.9 above 800 ms in 3 of the last 5 points fires, from the first breach."""
    s, now = series([200] * 10 + [850, 200, 900, 880, 210])
    d = p999_detector().detect(s, now)
    assert d.fired, d.reason
    assert d.episode_start == T0 + 5.0 * 10
    assert d.value == 880 and d.threshold == 800


def test_two_of_five_does_not_fire():
    """Two breaches among the last five points are not enough."""
    s, now = series([200] * 10 + [850, 200, 900, 200, 210])
    d = p999_detector().detect(s, now)
    assert not d.fired and "2/5" in d.reason


def test_n_of_m_survives_dip_that_resets_consecutive():
    """A one-scrape dip keeps 3-of-5 firing, while 3-of-3 (consecutive) is reset by it."""
    s, now = series([200] * 10 + [850, 860, 7.7, 900, 880])
    assert p999_detector().detect(s, now).fired
    assert not p999_detector(confirm_window_points=3).detect(s, now).fired


def test_below_direction():
    """direction=below fires on values under the threshold (e.g. throughput collapse)."""
    s, now = series([100] * 10 + [5, 4, 3])
    d = ThresholdDetector({"threshold": 10, "direction": "below"}).detect(s, now)
    assert d.fired


def test_the_threshold_is_the_recovery_line_on_the_side_opposite_the_breach():
    """Above: recovers below the threshold; below: above it. The params say so before detecting."""
    s, now = series([200] * 10 + [850, 200, 900, 880, 210])
    assert p999_detector().detect(s, now).recovery_line == RecoveryLine(800.0, Side.BELOW, "threshold")
    assert p999_detector().params.recovery_rule == RecoveryRule(Side.BELOW, 800.0)
    s, now = series([100] * 10 + [5, 4, 3])
    below = ThresholdDetector({"threshold": 10, "direction": "below"})
    assert below.detect(s, now).recovery_line == RecoveryLine(10.0, Side.ABOVE, "threshold")
    assert below.params.recovery_rule == RecoveryRule(Side.ABOVE, 10.0)
    assert p999_detector().detect(*series([200] * 15)).recovery_line is None


def test_stale_and_empty_do_not_fire():
    """No points in the window, or a stale newest point, give fired=False with a reason."""
    s, now = series([900] * 5)
    assert "stale" in p999_detector().detect(s, now + 120).reason
    assert "no data" in p999_detector().detect(Series({}, [], []), now).reason
    assert "no data" in p999_detector().detect(Series({}, [T0], [float("nan")]), T0).reason
    assert not p999_detector().detect(s, now + 120).fired


def test_malformed_series_does_not_raise():
    """A series with mismatched lengths returns fired=False with a reason."""
    d = p999_detector().detect(Series({}, [T0, T0 + 5], [1.0]), T0 + 5)
    assert not d.fired and "malformed" in d.reason


def test_episode_start_stable_across_cycles():
    """The same breach episode keeps its episode_start on every later cycle."""
    vals = [200.0] * 10 + [900, 900, 300, 900, 900, 900, 900]
    ts = T0 + 5.0 * np.arange(len(vals))
    det = p999_detector()
    starts = {det.detect(Series({}, ts[: k + 1], vals[: k + 1]), ts[k]).episode_start
              for k in range(13, len(vals))}  # fires from the 3rd breach on
    assert starts == {T0 + 50.0}


def test_params_are_strict():
    """Unknown keys, a missing threshold or N > M are errors at policy load."""
    with pytest.raises(pydantic.ValidationError):
        ThresholdParams(threshold=1, treshold=2)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        ThresholdParams()  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        ThresholdParams(threshold=1, confirm_points=6, confirm_window_points=5)
