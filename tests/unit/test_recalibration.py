"""The offline second calibration stage reads only outcomes known by then, and pulls a tenth of
probability toward what the series' own past in that tenth saw."""
from __future__ import annotations

import numpy as np

from evaluation.recalibration import recalibrated


def test_a_confident_forecast_that_never_came_true_is_pulled_down_and_only_by_known_outcomes():
    n, h = 400, 3
    p = np.full(n, 0.95)
    p[:5] = np.nan  # no forecast yet
    outcome = np.zeros(n, dtype=bool)
    decide = np.ones(n, dtype=bool)
    out = recalibrated(p, outcome, decide, h, strength=20.0)
    assert np.isnan(out[:5]).all()
    np.testing.assert_allclose(out[5:5 + h], 0.95)  # no outcome known yet: unchanged
    assert out[5 + h] < 0.95  # step 5's outcome is known h steps later
    assert out[-1] < 0.1 and np.all(np.diff(out[5 + h:]) <= 0)
    later = outcome.copy()
    later[300:] = True  # outcomes from step 300 are known at 300 + h at the earliest
    np.testing.assert_array_equal(recalibrated(p, later, decide, h, 20.0)[: 300 + h], out[: 300 + h])
    assert recalibrated(p, later, decide, h, 20.0)[-1] > out[-1]
