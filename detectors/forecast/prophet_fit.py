"""Picklable Prophet fit for the process pool: fit (optionally warm-started), return a compact forecast.

Runs in worker processes, never on the event loop; imports Prophet lazily so the detector
package stays cheap to import. Keep `fit_prophet_forecast` module-level: the pool pickles it by name.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from numpy.typing import NDArray

# Points kept before the history's end (at the series' step), so `detect` can anchor the curve on
# fresh actuals and calibrate on the series' recent errors against it.
_PAST_POINTS = 10
_MAX_FUTURE_POINTS = 400


def _silence_stan_logs() -> None:
    """cmdstanpy logs two INFO lines per fit (1,000 series flood the log). Its `get_logger`
    sets the level to DEBUG on first use, so call it first and then lower the level."""
    from cmdstanpy.utils.logging import get_logger

    get_logger().setLevel(logging.WARNING)
    logging.getLogger("prophet").setLevel(logging.WARNING)


@dataclass(frozen=True)
class ProphetForecast:
    """A fitted curve on a regular grid from shortly before the last history point onward."""

    times: NDArray[np.float64]  # unix seconds
    yhat: NDArray[np.float64]
    yhat_lower: NDArray[np.float64]
    yhat_upper: NDArray[np.float64]
    fitted_at: float  # unix time of the last history point the fit saw
    n_points: int  # points actually fitted (after downsampling)
    warm_started: bool
    init: Mapping[str, Any] = field(default_factory=dict)  # parameters to warm-start the next fit


def downsample_mean(
    ts: NDArray[np.float64], vs: NDArray[np.float64], max_points: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Means of consecutive groups so at most ``max_points`` remain (Prophet's cost grows with n)."""
    n = ts.size
    if n <= max_points:
        return ts, vs
    k = int(np.ceil(n / max_points))
    cut = n % k  # drop the oldest remainder so the newest point stays a group's end
    ts2 = ts[cut:].reshape(-1, k)
    vs2 = vs[cut:].reshape(-1, k)
    return ts2[:, -1], vs2.mean(axis=1)


def warm_start_params(model: Any) -> dict[str, Any]:
    """Prophet's documented recipe ("Updating fitted models") for a MAP fit's parameters."""
    res: dict[str, Any] = {}
    for name in ("k", "m", "sigma_obs"):
        res[name] = float(model.params[name][0][0])
    for name in ("delta", "beta"):
        res[name] = np.asarray(model.params[name][0], dtype=np.float64)
    return res


def fit_prophet_forecast(
    timestamps: NDArray[np.float64],
    values: NDArray[np.float64],
    *,
    ahead_seconds: float,
    step_seconds: float,
    init: Mapping[str, Any] | None = None,
    interval_width: float = 0.8,
    uncertainty_samples: int = 0,
    max_points: int = 2000,
    changepoint_range: float = 0.9,
    changepoint_prior_scale: float = 0.05,
    past_points: int = _PAST_POINTS,
) -> ProphetForecast:
    """Fit Prophet to one series and forecast ``ahead_seconds`` past its last point.

    Args:
        timestamps: unix seconds, ascending, finite.
        values: same length, finite.
        ahead_seconds: how far the forecast must reach; the caller adds the refit interval to
            the horizon so a cached forecast still covers ``now + horizon`` until the next fit.
        step_seconds: the series' own step; the forecast grid uses it, coarsened to at most
            400 future points.
        init: parameters of the previous fit (`ProphetForecast.init`) to warm-start from.
            Prophet replaces any whose shape no longer matches (seasonalities or changepoints
            changed) with its default, so a stale init is harmless.
        uncertainty_samples: 0 skips Prophet's simulation (its costliest step); then the
            lower and upper curves equal ``yhat``.
        past_points: points of the curve kept before the last history point, at the series'
            step: the detector calibrates on the series' errors against them.

    Returns:
        A `ProphetForecast`.
    """
    import pandas as pd
    from prophet import Prophet

    ts, vs = downsample_mean(np.asarray(timestamps, float), np.asarray(values, float), max_points)
    model = Prophet(
        interval_width=interval_width,
        uncertainty_samples=int(uncertainty_samples),
        changepoint_range=changepoint_range,
        changepoint_prior_scale=changepoint_prior_scale,
    )
    _silence_stan_logs()
    df = pd.DataFrame({"ds": pd.to_datetime(ts, unit="s"), "y": vs})
    warm = bool(init)
    if warm:
        model.fit(df, init=dict(init or {}))
    else:
        model.fit(df)

    last = float(ts[-1])
    fstep = max(float(step_seconds), ahead_seconds / _MAX_FUTURE_POINTS)
    past = last - float(step_seconds) * np.arange(max(past_points, 1), 0, -1)
    grid = np.concatenate([past, last + fstep * np.arange(0, int(np.ceil(ahead_seconds / fstep)) + 1)])
    pred = model.predict(pd.DataFrame({"ds": pd.to_datetime(grid, unit="s")}))
    yhat = pred["yhat"].to_numpy(dtype=np.float64)
    lower = pred["yhat_lower"].to_numpy(dtype=np.float64) if "yhat_lower" in pred else yhat
    upper = pred["yhat_upper"].to_numpy(dtype=np.float64) if "yhat_upper" in pred else yhat
    return ProphetForecast(
        times=grid,
        yhat=yhat,
        yhat_lower=lower,
        yhat_upper=upper,
        fitted_at=last,
        n_points=int(ts.size),
        warm_started=warm,
        init=warm_start_params(model),
    )
