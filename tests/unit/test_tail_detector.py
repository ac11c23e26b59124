"""Tests of detectors/tail.py: TailAnomalyDetector on synthetic P99.9 series (milliseconds)."""
from __future__ import annotations

import numpy as np
import pydantic
import pytest

from core.detection import RecoveryLine, Side
from core.query import Series
from detectors.tail import TailAnomalyDetector, TailAnomalyParams

STEP = 5.0
POINTS = 240  # default lookback (900 s + 300 s) at a 5 s scrape


def grid(n: int = POINTS) -> np.ndarray:
    return 1_700_000_000.0 + np.arange(n) * STEP


def noisy(level: float, sigma: float, n: int = POINTS, seed: int = 0) -> np.ndarray:
    return level + sigma * np.random.default_rng(seed).standard_normal(n)


def detector(**kw: object) -> TailAnomalyDetector:
    return TailAnomalyDetector({"min_absolute_increase": 50.0, **kw})


def test_fires_on_p999_jump_210_to_890():
    """The incident: P99.9 jumps 210 -> 890 ms after a stable, noisy baseline."""
    ts, vs = grid(), noisy(210, 15)
    vs[-6:] = noisy(890, 40, 6, seed=1)
    d = detector().detect(Series({}, ts, vs), now=ts[-1])
    assert d.fired, d.reason
    assert d.episode_start == ts[-6]
    assert d.baseline == pytest.approx(210, abs=10)
    assert d.threshold is not None and 260 <= d.threshold < 890
    assert d.score is not None and d.score > 5
    assert [t for t, _ in d.evidence] == list(ts[-6:])


def test_a_firing_detection_draws_its_threshold_as_the_recovery_line():
    """The threshold drawn from the pre-episode baseline is the line recovery holds below; a quiet
    detection draws none."""
    ts, vs = grid(), noisy(210, 15)
    vs[-6:] = noisy(890, 40, 6, seed=1)
    d = detector().detect(Series({}, ts, vs), now=ts[-1])
    assert d.threshold is not None and d.recovery_line == RecoveryLine(d.threshold, Side.BELOW, "threshold")
    assert detector().params.recovery_rule.good is Side.BELOW
    assert detector().detect(Series({}, ts, noisy(210, 15)), now=ts[-1]).recovery_line is None


def test_does_not_fire_on_noise():
    """Gaussian noise around a stable level never fires, over 500 independent series."""
    ts = grid()
    vals = np.stack([noisy(210, 20, seed=s) for s in range(500)])
    fired = detector().evaluate_many(ts, vals, now=ts[-1]).fired
    assert not fired.any()


def test_isolated_spikes_do_not_fire():
    """Single-scrape spikes (one per M points) never reach N of M."""
    ts, vs = grid(), noisy(210, 15)
    vs[-1], vs[-7], vs[-13] = 900, 900, 900
    d = detector().detect(Series({}, ts, vs), now=ts[-1])
    assert not d.fired
    assert "1/5" in d.reason


def test_tiny_absolute_values_do_not_fire():
    """A 4x jump on a ~1 ms series stays under the absolute floor; the same shape at 100x fires."""
    ts = grid()
    tiny = noisy(1.0, 0.05)
    tiny[-6:] = 4.0
    assert not detector().detect(Series({}, ts, tiny), now=ts[-1]).fired
    assert detector().detect(Series({}, ts, tiny * 100), now=ts[-1]).fired


def test_relative_floor_ignores_small_p99_move():
    """P99 85 -> 92 ms (+8%) on a very quiet series: huge robust score, but under the relative floor."""
    ts, vs = grid(), noisy(85, 0.5)
    vs[-6:] = 92
    d = detector(min_absolute_increase=1.0).detect(Series({}, ts, vs), now=ts[-1])
    assert not d.fired
    assert d.score is not None and d.score > 5  # the score alone would have fired


def test_n_of_m_survives_single_dip_where_consecutive_does_not():
    """Triton's summary dips for one scrape mid-incident: 3-of-5 still fires, 3-consecutive not."""
    ts, vs = grid(), noisy(210, 15)
    vs[-5:] = [890, 880, 7.7, 900, 895]
    series = Series({}, ts, vs)
    n_of_m = detector(confirm_points=3, confirm_window_points=5).detect(series, now=ts[-1])
    consecutive = detector(confirm_points=3, confirm_window_points=3).detect(series, now=ts[-1])
    assert n_of_m.fired and n_of_m.episode_start == ts[-5]
    assert not consecutive.fired


def test_episode_start_stable_across_cycles():
    """Successive cycles of one episode (with a dip in it) report the same episode_start."""
    ts, vs = grid(POINTS + 20), noisy(210, 15, POINTS + 20)
    onset = POINTS
    vs[onset:] = 890
    vs[onset + 5] = 8.0  # a dip
    det = detector()
    starts = []
    for k in range(onset + 2, POINTS + 20):  # each cycle sees data up to its own `now`
        d = det.detect(Series({}, ts[: k + 1], vs[: k + 1]), now=ts[k])
        if d.fired:
            starts.append(d.episode_start)
    assert len(starts) >= 15
    assert set(starts) == {ts[onset]}


def test_new_episode_after_quiet_gets_new_start():
    """After M-N+1 quiet points the old episode is over: a new jump has a new episode_start."""
    ts, vs = grid(), noisy(210, 15)
    vs[-20:-14] = 890  # first episode, then 14 quiet points
    vs[-4:] = 890
    d = detector().detect(Series({}, ts, vs), now=ts[-1])
    assert d.fired and d.episode_start == ts[-4]


def test_ongoing_anomaly_does_not_pollute_baseline():
    """An anomaly filling the whole 300 s evaluation window still fires: the baseline excludes it."""
    ts, vs = grid(), noisy(210, 15)
    vs[-60:] = 890
    d = detector().detect(Series({}, ts, vs), now=ts[-1])
    assert d.fired
    assert d.baseline == pytest.approx(210, abs=10)
    assert d.episode_start == ts[-60]


def test_divergence_flagged_when_p99_flat():
    """P99 stays at ~85 ms while P99.9 rises: the detection says the tail diverges."""
    ts, p999, p99 = grid(), noisy(210, 15), noisy(85, 2, seed=3)
    p999[-6:] = 890
    d = detector().detect(Series({}, ts, p999), now=ts[-1], companion=Series({}, ts, p99))
    assert d.fired
    assert d.details["diverging"] is True
    assert "diverges" in d.reason


def test_no_divergence_when_p99_rises_too():
    """P99 rises with P99.9 (instances saturated): not divergence; require_divergence blocks firing."""
    ts, p999, p99 = grid(), noisy(210, 15), noisy(85, 2, seed=3)
    p999[-6:] = 890
    p99[-6:] = 534
    pair = (Series({}, ts, p999), Series({}, ts, p99))
    d = detector().detect(pair[0], now=ts[-1], companion=pair[1])
    assert d.fired and d.details["diverging"] is False
    strict = detector(require_divergence=True).detect(pair[0], now=ts[-1], companion=pair[1])
    assert not strict.fired
    assert "no divergence" in strict.reason


def test_require_divergence_without_companion_does_not_fire():
    """require_divergence with no companion series: no decision can be made, so no firing."""
    ts, vs = grid(), noisy(210, 15)
    vs[-6:] = 890
    d = detector(require_divergence=True).detect(Series({}, ts, vs), now=ts[-1])
    assert not d.fired and "companion" in d.reason


BAD = {
    "empty": (np.array([]), np.array([]), "no data"),
    "all NaN": (grid(), np.full(POINTS, np.nan), "no data"),
    "constant": (grid(), np.full(POINTS, 210.0), "constant"),
    "too short": (grid(10), noisy(210, 15, 10), "too little history"),
    "length mismatch": (grid(), np.ones(5), "malformed"),
    "strings": (grid(3), np.array(["a", "b", "c"]), "malformed"),
    "infinities": (grid(), np.full(POINTS, np.inf), "no data"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_data_returns_not_fired_with_reason(case: str):
    """Empty, NaN, constant, too short or malformed series: fired=False and a reason, no raise."""
    ts, vs, word = BAD[case]
    now = float(ts[-1]) if len(ts) else 1_700_000_000.0
    d = detector().detect(Series({}, ts, vs), now=now)
    assert not d.fired
    assert word in d.reason


def test_stale_series_does_not_fire():
    """A series whose newest point is older than max_staleness_seconds is stale, not firing."""
    ts, vs = grid(), noisy(210, 15)
    vs[-6:] = 890
    d = detector().detect(Series({}, ts, vs), now=ts[-1] + 120)
    assert not d.fired and "stale" in d.reason


def test_nan_gaps_are_skipped_not_counted():
    """NaN scrapes inside the incident are skipped: N-of-M counts the last M *valid* points."""
    ts, vs = grid(), noisy(210, 15)
    vs[-6:] = [890, np.nan, 880, np.nan, np.nan, 900]
    d = detector().detect(Series({}, ts, vs), now=ts[-1])
    assert d.fired and d.episode_start == ts[-6]
    assert d.details["missing_points"] == 3


def test_no_look_ahead_points_after_now_ignored():
    """Points after `now` are ignored: a jump that happens later cannot fire earlier."""
    ts, vs = grid(), noisy(210, 15)
    vs[-6:] = 890
    d = detector().detect(Series({}, ts, vs), now=ts[-7])
    assert not d.fired


def test_batch_path_agrees_with_single_path():
    """detect_many over [S x P] gives the same decisions and figures as detect per series."""
    rng = np.random.default_rng(11)
    ts = grid()
    vals = 50 + rng.uniform(10, 300, (60, 1)) * (1 + 0.08 * rng.standard_normal((60, POINTS)))
    vals[::3, -7:] *= 4  # a third jump
    vals[1::7, -3] = 5.0  # dips
    vals[rng.random(vals.shape) < 0.02] = np.nan
    vals[5, :] = 42.0  # constant
    vals[6, :-20] = np.nan  # too short
    det = detector()
    many = det.detect_many([Series({}, ts, row) for row in vals], now=ts[-1])
    singles = [det.detect(Series({}, ts, row), now=ts[-1]) for row in vals]
    assert sum(d.fired for d in many) >= 15
    for a, b in zip(many, singles):
        assert (a.fired, a.episode_start, a.reason, a.evidence) == (b.fired, b.episode_start,
                                                                   b.reason, b.evidence)
        assert a.value == b.value and a.threshold == b.threshold


def test_batch_path_with_companion_agrees_with_per_series_detect():
    """evaluate_many with a companion array flags the same rows as detect(companion=) per series."""
    ts = grid()
    p999 = np.stack([noisy(210, 15, seed=s) for s in range(6)])
    p999[:, -6:] = 890
    p99 = np.stack([noisy(85, 2, seed=100 + s) for s in range(6)])
    p99[::2, -6:] = 600
    det = detector()
    batch = det.evaluate_many(ts, p999, now=ts[-1], companion=(ts, p99))
    singles = [det.detect(Series({}, ts, a), now=ts[-1], companion=Series({}, ts, b))
               for a, b in zip(p999, p99)]
    assert list(batch.diverging) == [d.details["diverging"] for d in singles]
    assert list(batch.diverging) == [False, True] * 3


def test_lookback_is_baseline_plus_evaluation_window():
    """lookback_seconds tells the poller to query baseline + evaluation window."""
    det = detector(baseline_window_seconds=600, evaluation_window_seconds=120)
    assert det.lookback_seconds == 720


def test_params_reject_unknown_keys_and_n_above_m():
    """Strict params: an unknown key or N > M is a policy load error."""
    with pytest.raises(pydantic.ValidationError):
        TailAnomalyParams(min_absolute_increase=1, baseline_window=5)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        TailAnomalyParams(min_absolute_increase=1, confirm_points=4, confirm_window_points=3)
    with pytest.raises(pydantic.ValidationError):
        TailAnomalyParams()  # type: ignore[call-arg]  # the unit-bearing floor has no default
