"""The NAB ceiling's pieces: the gap to the line in noise units reads only the past, and scales
with the noise; the rise run counts consecutive rises; the calendar reads a crossing a period
ago, within the horizon ahead of that time, and nothing later."""
from __future__ import annotations

import numpy as np

from evaluation.nab_ceiling import crossed_a_period_ago, noise_units, rise_runs


def test_noise_units_read_only_the_past_and_scale_with_the_noise():
    rng = np.random.default_rng(3)
    y = 100.0 + rng.normal(0.0, 1.0, 400)
    units = noise_units(y, 110.0, 50)
    assert np.isnan(units[:10]).all() and np.isfinite(units[11:]).all()
    later = y.copy()
    later[300:] += 50.0  # the future changes: nothing before it may move
    np.testing.assert_array_equal(noise_units(later, 110.0, 50)[:300], units[:300])
    wider = noise_units(100.0 + 2.0 * (y - 100.0), 100.0 + 2.0 * 10.0, 50)
    np.testing.assert_allclose(wider[11:], units[11:], rtol=1e-9)


def test_rise_runs_count_consecutive_rises():
    assert rise_runs(np.array([1.0, 2.0, 3.0, 3.0, 4.0, 5.0, 6.0, 2.0])).tolist() == [0, 1, 2, 0, 1, 2, 3, 0]


def test_a_crossing_a_period_ago_shows_over_the_horizon_before_its_anniversary():
    y = np.zeros(100)
    y[40] = 1.0  # over the line at step 40 only
    seen = crossed_a_period_ago(y, 1.0, period_points=20, horizon=3)
    assert np.nonzero(seen)[0].tolist() == [57, 58, 59]  # 40 + 20 - 3 .. 40 + 20 - 1
    later = y.copy()
    later[70:] = 5.0  # the future changes: nothing up to 70 may move
    np.testing.assert_array_equal(crossed_a_period_ago(later, 1.0, 20, 3)[:71], seen[:71])
    assert not crossed_a_period_ago(y, 1.0, period_points=2, horizon=3).any()  # the span would reach the future
