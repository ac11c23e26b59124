"""Damped-trend Holt: fitting, batching and forecast intervals."""
from __future__ import annotations

import numpy as np
import pytest

from detectors.forecast import fit_holt, holt_forecast, holt_states


def test_recovers_a_clean_linear_trend() -> None:
    """A noise-free line gives about its slope as the trend and its last value as the level."""
    y = 3.0 + 2.0 * np.arange(200)
    fit = fit_holt(y)
    assert fit.trend[0] == pytest.approx(2.0, rel=0.1)  # damping keeps it a little under
    assert fit.level[0] == pytest.approx(y[-1], rel=1e-3)
    point, _ = holt_forecast(fit, 5)
    assert np.all(np.diff(point[0]) > 0)  # still rising, damped below the line
    assert point[0, -1] <= y[-1] + 2.0 * 5 + 1e-6


def test_batch_equals_single_fits() -> None:
    """Fitting rows together gives the same result as fitting each alone."""
    rng = np.random.default_rng(1)
    y = rng.normal(0, 1, (3, 150)).cumsum(axis=1)
    batch = fit_holt(y)
    for i in range(3):
        one = fit_holt(y[i])
        for name in ("level", "trend", "alpha", "beta", "phi", "sigma"):
            assert getattr(batch, name)[i] == pytest.approx(getattr(one, name)[0])


def test_flat_noise_has_small_trend_and_widening_interval() -> None:
    """Stationary noise: near-zero trend, a standard error near the noise and growing with h."""
    y = 100 + np.random.default_rng(2).normal(0, 5, 400)
    fit = fit_holt(y)
    point, se = holt_forecast(fit, 60)
    assert abs(point[0, -1] - 100) < 15
    assert 3 < se[0, 0] < 8
    assert np.all(np.diff(se[0]) >= 0)


def test_too_short_raises() -> None:
    """Fewer than 3 points is a caller error (the detector checks before calling)."""
    with pytest.raises(ValueError):
        fit_holt(np.array([1.0, 2.0]))


def test_a_step_moves_the_level_not_the_trend() -> None:
    """A level shift (two jumps on one side in a row) moves the filtered level to the new value
    at once and leaves the trend near zero: a deploy's +80 ms is not a ramp."""
    rng = np.random.default_rng(3)
    y = 200 + rng.normal(0, 5, 300)
    y[200:] += 80.0
    levels, trends = holt_states(y[None], np.array([0.2]), np.array([0.02]), np.array([0.95]))
    assert levels[0, 203] == pytest.approx(280, abs=15)
    assert abs(trends[0, 210]) < 1.0  # ms per step; a learned jump would be several


def test_a_staircase_teaches_the_trend_its_rate() -> None:
    """Same-side level shifts a few steps apart (+30 every 3 points, noise-free) are one trend:
    the filter learns about 10 per step instead of shifting its level at every stair."""
    y = np.full(300, 200.0)
    k = np.arange(60)
    y[240:] += 30.0 * (k // 3 + 1)
    _, trends = holt_states(y[None], np.array([0.2]), np.array([0.02]), np.array([0.98]))
    assert trends[0, 220] == pytest.approx(0.0, abs=1e-9)
    assert trends[0, 260:].mean() == pytest.approx(10.0, rel=0.3)


def test_fit_accepts_left_padded_shorter_rows() -> None:
    """A NaN-padded row (a shorter history in a batch) fits as it would alone."""
    rng = np.random.default_rng(4)
    y = rng.normal(0, 1, (2, 200)).cumsum(axis=1)
    padded = y.copy()
    padded[1, :50] = np.nan
    batch, alone = fit_holt(padded), fit_holt(y[1, 50:])
    assert batch.alpha[1] == alone.alpha[0] and batch.phi[1] == alone.phi[0]
    assert batch.level[1] == pytest.approx(alone.level[0])


def test_noise_after_a_shift_up_is_not_read_as_a_staircase() -> None:
    """Latency noise grows with the level: five steps after a shift from 160 to 370 ms with 15%
    log-normal noise, ordinary noise passed a limit in milliseconds taken over a window mostly at
    160 ms twice on one side, and a staircase trend was learnt (33 ms per step on seed 6). The
    limit is a share of the level, so no trend is learnt on any seed."""
    trends = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        level = np.r_[np.full(355, 160.0), np.full(5, 370.0)]
        y = level * np.exp(0.15 * rng.standard_normal(level.size))
        trends.append(float(fit_holt(y, step_seconds=30.0).trend[0]))
    assert max(abs(t) for t in trends) < 3.0, trends  # ms per 30 s step
