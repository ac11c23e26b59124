"""The Prophet backend: fits run in the process pool on a staggered schedule and are cached;
`forecast` only re-anchors the cached curve on the latest actuals and calibrates it on the series'
errors against that curve over the window."""
from __future__ import annotations

import asyncio
import functools
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Sequence

import numpy as np
from numpy.typing import NDArray

from core.query import Series, series_key
from detectors.base import Offload
from detectors.forecast.arrays import History, read_history, window_of
from detectors.forecast.calibration import PathForecast, anchored_paths, level_points, level_weights
from detectors.forecast.outlook import Outlook, outlook_of
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.prophet_fit import ProphetForecast, fit_prophet_forecast
from detectors.forecast.refit_schedule import next_refit_time, refit_due, refit_phase_seconds

_ANCHOR_POINTS = 5


def anchor_offset(ts: NDArray[np.float64], vs: NDArray[np.float64], curve_times: NDArray[np.float64],
                  curve: NDArray[np.float64], points: int = _ANCHOR_POINTS) -> float:
    """Median gap between the latest actuals and a cached curve (over the curve's span): how far
    the series has moved off a forecast that may be a refit interval old."""
    recent = (ts >= curve_times[0]) & (ts <= curve_times[-1])
    rts, rvs = ts[recent][-points:], vs[recent][-points:]
    return float(np.median(rvs - np.interp(rts, curve_times, curve))) if rts.size else 0.0


@dataclass
class _SeriesState:
    phase: float  # this series' refit slot within the interval
    last_seen: float
    last_attempt: float | None = None
    forecast: ProphetForecast | None = None
    last_error: str | None = None


class ProphetForecaster:
    """Never fits in `curves` or on the event loop: a fit costs seconds of CPU."""

    def __init__(self, params: ForecastBreachParams) -> None:
        self.params = params
        self._states: dict[str, _SeriesState] = {}

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload,
                      loads: Sequence[Series | None] | None = None) -> None:
        """Refit the series whose slot is due, at most `max_fits_per_cycle` of them (`loads` are not
        read: the capacity knee is Holt's, and a Prophet policy with a rate beside it fails to load)."""
        p = self.params
        seen = set()
        due: list[tuple[int, float, str, History]] = []
        for s in batch:
            key = series_key(s.labels)
            seen.add(key)
            st = self._states.get(key)
            if st is None:
                st = self._states[key] = _SeriesState(
                    phase=refit_phase_seconds(key, p.refit_interval_seconds), last_seen=now
                )
            st.last_seen = now
            if not refit_due(st.last_attempt, st.phase, p.refit_interval_seconds, now):
                continue
            try:
                history = read_history(s, now, p)
            except ValueError as exc:  # malformed series: remember why, detect reports it
                st.last_error = str(exc)
                continue
            if history.timestamps.size < p.min_history_points or np.ptp(history.values) == 0:
                continue  # not worth a fit yet; retried next cycle as history grows
            overdue = now - (next_refit_time(st.last_attempt, st.phase, p.refit_interval_seconds)
                             if st.last_attempt is not None else now)
            # never-fitted series first, then the most overdue: a startup storm drains in order
            due.append((0 if st.forecast is None else 1, -overdue, key, history))
        for key in [k for k, st in self._states.items()
                    if k not in seen and now - st.last_seen > p.lookback_seconds]:
            del self._states[key]  # series gone for a whole lookback: forget its model
        due.sort(key=lambda d: (d[0], d[1]))
        due = due[: p.max_fits_per_cycle]
        if not due:
            return
        results = await asyncio.gather(*(self._fit(k, h, offload) for _, _, k, h in due),
                                       return_exceptions=True)
        for (_, _, key, _), res in zip(due, results):
            st = self._states[key]
            st.last_attempt = now  # also on failure, so a failing series waits for its next slot
            if isinstance(res, asyncio.CancelledError):
                raise res
            if isinstance(res, BaseException):  # keep the previous forecast, report the error
                st.last_error = f"{type(res).__name__}: {res}"
            else:
                st.forecast, st.last_error = res, None

    def _fit(self, key: str, history: History, offload: Offload) -> Awaitable[Any]:
        p = self.params
        previous = self._states[key].forecast
        # A partial of the module-level function pickles by name, so the pool can run it.
        fn = functools.partial(
            fit_prophet_forecast,
            # Reach past the next refit, so the cached curve covers now + horizon until then.
            ahead_seconds=p.horizon_seconds + 2 * p.refit_interval_seconds,
            step_seconds=history.step,
            init=previous.init if previous is not None else None,
            uncertainty_samples=0,  # the spread comes from the series' own errors, not Prophet's draws
            max_points=p.prophet_max_points,
            past_points=p.holt_fit_points,
        )
        return offload(fn, history.timestamps, history.values)

    def forecast(self, key: str, history: History, now: float, load: History | None = None) -> Outlook | str:
        p = self.params
        st = self._states.get(key)
        f = st.forecast if st else None
        if f is None:
            why = f" (last fit failed: {st.last_error})" if st and st.last_error else ""
            return f"no Prophet forecast yet: fit pending{why}"
        if f.times[-1] < now + p.horizon_seconds:
            return (f"Prophet forecast from {f.fitted_at:.0f} ends before now + horizon: "
                    "refit overdue")
        grid, values = window_of(history, p.holt_fit_points)
        step = history.step
        steps = max(1, int(math.ceil((now + p.horizon_seconds - grid[-1]) / step - 1e-9)))
        times = np.concatenate([grid, grid[-1] + step * np.arange(1, steps + 1)])
        curve = np.interp(times, f.times, f.yhat, left=np.nan, right=np.nan)
        first = int(np.argmax(np.isfinite(curve)))
        if not np.isfinite(curve[first:]).all() or grid.size - first < p.min_history_points:
            return "Prophet forecast does not cover the window: refit overdue"
        points = level_points(p.level_window_seconds, step)
        relative = p.errors == "relative"
        # The curve is shifted by how far the latest actuals sit from it (the fit may be up to a
        # refit interval old, and a level change since then must show without waiting for it).
        point, errors = anchored_paths(values[first:], curve[first:], steps, points, relative)
        offset = anchor_offset(history.timestamps, history.values, f.times, f.yhat)
        info = {"model": "prophet", "fitted_at": f.fitted_at, "fit_points": f.n_points,
                "warm_started": f.warm_started, "anchor_offset": offset, "step_seconds": step,
                "level_points": points}
        local = level_weights(values[first:], errors.shape[0], steps, points)
        forecast = PathForecast.from_errors(float(grid[-1]), step, point, errors, relative, 1e9, info, local)
        return outlook_of(forecast, p.threshold, p.direction)
