"""Damped-trend Holt: fitting, batching and forecast intervals."""
from __future__ import annotations

import numpy as np
import pytest

from detectors.forecast import fit_holt, holt_forecast


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
