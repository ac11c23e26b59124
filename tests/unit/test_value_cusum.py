"""Tests of detectors/value_cusum.py: the value CUSUM on synthetic latency series (ms), and its
registered detector `value_cusum`."""
from __future__ import annotations

import numpy as np
import pydantic
import pytest

from core.detection import RecoveryLine, Side
from core.query import Series
from detectors.registry import DETECTORS
from detectors.value_cusum import (
    NO_DATA, OK, SHORT_HISTORY, STALE, ValueCusumDetector, ValueCusumParams, evaluate_value_cusum,
)
from evaluation.cusum_eval import EVAL_PARAMS, evaluate, stream_onsets
from evaluation.nab_data import load_series

STEP = 5.0
T0 = 1_700_000_000.0
PARAMS = ValueCusumParams()
POINTS = int(PARAMS.lookback_seconds / STEP)  # 480 at the defaults


def grid(n: int = POINTS) -> np.ndarray:
    return T0 + np.arange(n) * STEP


def noisy(level: float, sigma: float, n: int = POINTS, seed: int = 0) -> np.ndarray:
    return level + sigma * np.random.default_rng(seed).standard_normal(n)


def first_firing(params: ValueCusumParams, ts: np.ndarray, vs: np.ndarray, after: int) -> int:
    """Index of the first cycle at or after `after` that fires, seeing only points up to it."""
    for i in range(after, ts.size):
        if evaluate_value_cusum(params, ts[: i + 1], vs[None, : i + 1], ts[i]).fired[0]:
            return i
    return -1


def test_fires_on_step_up_within_three_points():
    """P99.9 210 -> 890 ms: fires on the 2nd or 3rd slow point, episode starts at the step."""
    ts, vs = grid(), noisy(210, 15)
    vs[400:] = noisy(890, 40, POINTS - 400, seed=1)
    i = first_firing(PARAMS, ts, vs, 395)
    assert 400 < i <= 402
    b = evaluate_value_cusum(PARAMS, ts[: i + 1], vs[None, : i + 1], ts[i])
    assert b.status[0] == OK and b.episode_start[0] == 400
    assert b.statistic[0] > b.threshold[0] == PARAMS.threshold_sigmas
    assert b.baseline[0] == pytest.approx(210, abs=5) and b.value[0] == vs[i]


def test_single_spike_does_not_fire():
    """One slow scrape adds at most max_step_sigmas: not an incident on its own."""
    ts, vs = grid(), noisy(210, 15)
    vs[-1] = 5000
    b = evaluate_value_cusum(PARAMS, ts, vs[None, :], ts[-1])
    assert not b.fired[0] and 0 < b.statistic[0] <= PARAMS.max_step_sigmas


@pytest.mark.slow
def test_quiet_on_stationary_noise():
    """20 seeded noisy series streamed over 2,000 cycles each: at most 2 false episodes in all."""
    onsets = sum(int(stream_onsets(PARAMS, noisy(210, 15, 2000, seed=s))[1].sum()) for s in range(20))
    assert onsets <= 2


def test_episode_start_stable_across_cycles():
    """An ongoing step keeps one episode_start while the baseline window slides for 150 cycles."""
    ts, vs = grid(POINTS + 200), noisy(210, 15, POINTS + 200)
    vs[400:] = noisy(400, 30, POINTS - 200, seed=2)
    starts = {
        int(b.episode_start[0]) + i - POINTS + 1
        for i in range(402, 550)
        for b in [evaluate_value_cusum(PARAMS, ts[i - POINTS + 1: i + 1],
                                       vs[None, i - POINTS + 1: i + 1], ts[i])]
        if b.fired[0]
    }
    assert starts == {400}


def test_nan_gaps_neither_build_nor_drain():
    """Missing scrapes inside the baseline and the episode: it still fires at the same start."""
    ts, vs = grid(), noisy(210, 15)
    vs[400:] = 890.0
    vs[::7] = np.nan
    vs[401] = np.nan
    b = evaluate_value_cusum(PARAMS, ts[:405], vs[None, :405], ts[404])
    assert b.fired[0] and b.episode_start[0] == 400
    empty = evaluate_value_cusum(PARAMS, ts, np.full((1, POINTS), np.nan), ts[-1])
    assert empty.status[0] == NO_DATA and not empty.fired[0] and empty.latest[0] == -1


def test_short_history_decides_after_ten_points():
    """A new model: 12 points of history then a step fires; 6 points is SHORT_HISTORY."""
    ts, vs = grid(20), noisy(210, 15, 20)
    vs[12:] = 890.0
    b = evaluate_value_cusum(PARAMS, ts[:15], vs[None, :15], ts[14])
    assert b.fired[0] and b.episode_start[0] == 12
    short = evaluate_value_cusum(PARAMS, ts[:6], vs[None, :6], ts[5])
    assert short.status[0] == SHORT_HISTORY and not short.fired[0]


def test_constant_series_is_quiet_and_a_step_from_it_fires():
    """MAD 0: no division blow-up on a flat series; a 2x step from flat still fires."""
    ts = grid()
    flat = np.full(POINTS, 7.7)
    b = evaluate_value_cusum(PARAMS, ts, flat[None, :], ts[-1])
    assert b.status[0] == OK and not b.fired[0] and b.statistic[0] == 0
    step = flat.copy()
    step[-3:] = 15.4
    assert evaluate_value_cusum(PARAMS, ts, step[None, :], ts[-1]).fired[0]


def test_stale_data_never_fires():
    """Newest point older than max_staleness_seconds: STALE, even with a step in it."""
    ts, vs = grid(), noisy(210, 15)
    vs[-5:] = 890.0
    b = evaluate_value_cusum(PARAMS, ts, vs[None, :], ts[-1] + 61)
    assert b.status[0] == STALE and not b.fired[0]


def test_direction_up_ignores_drops_both_sees_them():
    """A latency drop is not an incident by default; direction both reports it as side -1."""
    ts, vs = grid(), noisy(210, 15)
    vs[-4:] = 20.0
    assert not evaluate_value_cusum(PARAMS, ts, vs[None, :], ts[-1]).fired[0]
    both = evaluate_value_cusum(PARAMS.model_copy(update={"direction": "both"}), ts, vs[None, :], ts[-1])
    assert both.fired[0] and both.direction[0] == -1


def test_min_absolute_increase_is_a_floor():
    """A 3 ms model going to 4 ms is many sigmas, but under a 50 ms floor it adds nothing."""
    ts, vs = grid(), noisy(3.0, 0.05)
    vs[-10:] = 4.0
    assert evaluate_value_cusum(PARAMS, ts, vs[None, :], ts[-1]).fired[0]
    floored = PARAMS.model_copy(update={"min_absolute_increase": 50.0})
    assert not evaluate_value_cusum(floored, ts, vs[None, :], ts[-1]).fired[0]


def test_rows_are_independent():
    """The batch decides each row as it would alone."""
    ts = grid()
    rows = np.stack([noisy(210, 15, seed=s) for s in range(4)])
    rows[1, -4:] = 890.0
    rows[2, ::3] = np.nan
    batch = evaluate_value_cusum(PARAMS, ts, rows, ts[-1])
    for i in range(4):
        one = evaluate_value_cusum(PARAMS, ts, rows[i: i + 1], ts[-1])
        assert one.fired[0] == batch.fired[i] and one.statistic[0] == pytest.approx(batch.statistic[i])
    assert batch.fired.tolist() == [False, True, False, False]


def test_params_are_strict():
    """Unknown keys and an unknown direction are load errors."""
    with pytest.raises(pydantic.ValidationError):
        ValueCusumParams.model_validate({"drift": 1.0})
    with pytest.raises(pydantic.ValidationError):
        ValueCusumParams.model_validate({"direction": "down"})


def test_registered_as_its_own_detector_and_fires_on_a_step_up():
    """`type: value_cusum` is the value CUSUM (what tail_excess's `input: values` was): it fires on a
    step up with the batch's verdict, and draws its recovery line where points stop adding evidence,
    the pre-episode baseline plus the drift allowance, recovering below it."""
    assert DETECTORS["value_cusum"] is ValueCusumDetector
    ts = tuple(T0 + 5.0 * i for i in range(400))
    rng = np.random.default_rng(0)
    vals = tuple(float(v) for v in np.r_[rng.normal(10, 0.5, 380), rng.normal(40, 0.5, 20)])
    det = ValueCusumDetector({})
    d = det.detect(Series({"model": "ranker"}, ts, vals), ts[-1])
    batch = evaluate_value_cusum(PARAMS, np.array(ts), np.array(vals)[None, :], ts[-1])
    assert d.fired and batch.fired[0] and d.episode_start == ts[int(batch.episode_start[0])]
    assert d.detector == "value_cusum" and d.details["direction"] == 1
    base, scale = float(batch.baseline[0]), float(batch.scale[0])
    allowance = max(PARAMS.drift_sigmas * scale, PARAMS.min_relative_change * base)
    assert d.recovery_line == RecoveryLine(base + allowance, Side.BELOW, "baseline + allowance")
    assert 10.0 < d.recovery_line.level < 40.0
    assert det.lookback_seconds == PARAMS.lookback_seconds
    assert det.detect_many([Series({"model": "ranker"}, ts, vals)], ts[-1]) == [d]


def test_a_drop_seen_by_both_sides_recovers_above_its_line():
    """direction both: a step down fires from the mirrored side and its line is below the baseline,
    recovering above it."""
    ts = tuple(T0 + 5.0 * i for i in range(400))
    rng = np.random.default_rng(1)
    vals = tuple(float(v) for v in np.r_[rng.normal(100, 2, 380), rng.normal(20, 2, 20)])
    d = ValueCusumDetector({"direction": "both"}).detect(Series({"model": "ranker"}, ts, vals), ts[-1])
    assert d.fired and d.details["direction"] == -1
    assert d.recovery_line is not None and d.recovery_line.good is Side.ABOVE
    assert 20.0 < d.recovery_line.level < d.baseline  # type: ignore[operator]


def test_quiet_or_undecided_detections_draw_no_line_and_bad_data_never_raises():
    """Only a firing detection draws a line; malformed series answer with a reason."""
    ts = grid()
    quiet = ValueCusumDetector({}).detect(Series({}, tuple(ts), tuple(noisy(210, 15))), float(ts[-1]))
    assert not quiet.fired and quiet.recovery_line is None
    bad = ValueCusumDetector({}).detect(Series({}, (1.0, 2.0), (1.0,)), 2.0)
    assert not bad.fired and bad.reason.startswith("malformed series")


@pytest.mark.slow
def test_nab_standard_score_beats_windowed_gaussian():
    """The NAB parameter set scores >= 30.5 on the dev subset (windowedGaussian, the lowest
    published detector there), with one parameter set for all 17 series."""
    assert evaluate(load_series(), EVAL_PARAMS, "standard").normalized >= 30.5
