"""The forecasters the evaluation scores, run over many decision origins at once.

Each calibrated model turns a batch of equally long windows (one per decision origin, each ending at
its origin) into now's point paths and the past error paths the detector would compute from the same
window (detectors/forecast/calibration.py): the probability is then read exactly as the detector
reads it. `predict_linear` is the Prometheus rule users write, `predict_linear(x[w], H) > L`: no
probability, a margin on the line as its knob.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from detectors.forecast.calibration import BURN_IN_POINTS, anchored_paths, error_paths, level_weights
from detectors.forecast.holt_paths import (HoltParams, holt_batch, holt_fit_params, holt_load_fit_params,
                                           holt_load_paths, holt_paths)
from detectors.forecast.prophet_fit import fit_prophet_forecast

FLOAT = NDArray[np.float64]


@dataclass(frozen=True)
class Setup:
    """How one dataset is forecast: its grid and the detector's parameters in steps."""

    step_seconds: float
    horizon_steps: int
    level_points: int
    window_points: int  # holt_fit_points: the window every model sees
    relative: bool
    half_life_paths: float  # recency weight of past error paths
    holt_refit_steps: int  # Holt's parameters are refitted this often (states every step)
    prophet_refit_steps: int
    prophet_lookback_seconds: float
    holt_select_steps: int = 0  # Holt's parameters scored by the error this many steps ahead (0: one)


def naive_paths(windows: FLOAT, setup: Setup) -> tuple[FLOAT, FLOAT]:
    """The last value, flat: what the calibrated errors alone know."""
    h = setup.horizon_steps
    b, n = windows.shape
    point = np.repeat(windows[:, -1:], h, axis=1)
    first = min(BURN_IN_POINTS, n - 1)
    back = np.repeat(windows[:, first:, None], h, axis=2)
    return point, error_paths(windows, back, first, setup.level_points, setup.relative)


def linear_fit(windows: FLOAT, width: int) -> tuple[FLOAT, FLOAT]:
    """OLS over the last `width` points ending at every index: (value at the index, slope per step);
    NaN where fewer than `width` points precede. Shapes ``(B, n)``."""
    b, n = windows.shape
    out_v = np.full((b, n), np.nan)
    out_s = np.full((b, n), np.nan)
    if width < 2 or n < width:
        return out_v, out_s
    x = np.arange(width, dtype=np.float64) - (width - 1)  # 0 at the newest point
    xm, xx = x.mean(), ((x - x.mean()) ** 2).sum()
    win = sliding_window_view(windows, width, axis=1)  # (B, n - width + 1, width)
    ym = win.mean(axis=2)
    slope = ((win - ym[..., None]) * (x - xm)).sum(axis=2) / xx
    out_v[:, width - 1 :] = ym - slope * xm  # the line's value at x = 0, the newest point
    out_s[:, width - 1 :] = slope
    return out_v, out_s


def predict_linear_rule(windows: FLOAT, setup: Setup, width: int) -> FLOAT:
    """Prometheus' ``predict_linear(x[width steps], H)``: the OLS line's value H steps ahead."""
    value, slope = linear_fit(windows[:, -width:], width)
    return np.asarray(value[:, -1] + slope[:, -1] * setup.horizon_steps, dtype=np.float64)


def holt_model_paths(windows: FLOAT, params: HoltParams, setup: Setup) -> tuple[FLOAT, FLOAT]:
    """Holt with the given parameters (fitted at the last refit origin)."""
    return holt_paths(holt_batch(windows, setup.step_seconds, params), windows, setup.horizon_steps, setup.level_points,
                      setup.relative)


def holt_params(windows: FLOAT, setup: Setup) -> HoltParams:
    return holt_fit_params(windows, setup.step_seconds, setup.holt_select_steps)


def holt_load_params(windows: FLOAT, rates: FLOAT, setup: Setup) -> tuple[HoltParams, HoltParams | None]:
    """Holt's parameters with the request rate beside the latency (the capacity knee): the primary
    rows' and the log rates', as the detector fits them."""
    return holt_load_fit_params(windows, rates, setup.step_seconds)


def holt_load_model_paths(windows: FLOAT, rates: FLOAT, params: HoltParams, rate_params: HoltParams | None,
                          setup: Setup, line: float) -> tuple[FLOAT, FLOAT]:
    """Holt with the capacity knee where the rate explains the latency (plain Holt elsewhere)."""
    point, errors, _ = holt_load_paths(windows, rates, params, rate_params, setup.step_seconds,
                                       setup.horizon_steps, setup.level_points, setup.relative, line)
    return point, errors


def prophet_curve(ts: FLOAT, vs: FLOAT, grid: FLOAT, fit_index: int, setup: Setup,
                  init: object | None) -> tuple[FLOAT, object]:
    """Fit Prophet on the raw points up to grid[fit_index] (its lookback) and return its curve on the
    grid from the window before the fit to a refit interval plus a horizon after it (NaN outside)."""
    end = grid[fit_index]
    keep = (ts <= end) & (ts > end - setup.prophet_lookback_seconds)
    ahead = (setup.prophet_refit_steps + setup.horizon_steps) * setup.step_seconds
    f = fit_prophet_forecast(ts[keep], vs[keep], ahead_seconds=ahead, step_seconds=setup.step_seconds,
                             init=init, past_points=setup.window_points)  # type: ignore[arg-type]
    curve = np.interp(grid, f.times, f.yhat, left=np.nan, right=np.nan)
    return curve, f.init


def prophet_model_paths(window: FLOAT, curve: FLOAT, setup: Setup) -> tuple[FLOAT, FLOAT, FLOAT]:
    """One origin: the anchored Prophet curve (window plus horizon), its past error paths and their
    level weights, as the detector reads them."""
    ok = np.isfinite(curve)
    first = int(np.argmax(ok)) if ok.any() else curve.size
    point, errors = anchored_paths(window[first:], curve[first:], setup.horizon_steps, setup.level_points,
                                   setup.relative)
    return point, errors, level_weights(window[first:], errors.shape[0], setup.horizon_steps, setup.level_points)
