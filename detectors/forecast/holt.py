"""The Holt backend: a damped-trend fit every cycle, batched through the process pool for many
series of one length, inline otherwise. Its interval is the ETS(A,Ad,N) one."""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np
from numpy.typing import NDArray

from core.query import Series, series_key
from detectors.base import Offload
from detectors.forecast.arrays import History, read_history, regularize
from detectors.forecast.holt_fit import HoltFit, fit_holt, holt_forecast
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.protocol import Curves

# Below this many equally long series, shipping a batch to the pool costs more than fitting inline.
_BATCH_MIN = 16


@dataclass(frozen=True)
class _CachedFit:
    """A fit from this cycle's `prepare`, valid only for the same cycle and the same window."""

    at: float  # the cycle's `now`
    last_time: float  # the window's last grid point
    size: int
    fit: HoltFit


class HoltForecaster:
    """Refits every cycle (about 0.2 ms a series): nothing to warm up, nothing stale to keep."""

    def __init__(self, params: ForecastBreachParams) -> None:
        self.params = params
        # The breach-side interval edge is point + z * se, z the (1 + width) / 2 normal quantile.
        self._z = NormalDist().inv_cdf((1.0 + params.interval_width) / 2.0)
        self._cache: dict[str, _CachedFit] = {}

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        """Batch-fit equally long series in the pool; `curves` fits the rest inline."""
        self._cache = {}
        groups: dict[int, list[tuple[str, float, NDArray[np.float64]]]] = {}
        for s in batch:
            try:
                history = read_history(s, now, self.params)
            except ValueError:  # malformed series: detect reports it
                continue
            if history.timestamps.size < self.params.min_history_points:
                continue
            window = self._window(history)
            if not isinstance(window, str):
                groups.setdefault(window[1].size, []).append((series_key(s.labels), *window))
        for n, items in groups.items():
            if len(items) < _BATCH_MIN:
                continue  # curves fits these inline
            try:
                fit: HoltFit = await offload(fit_holt, np.stack([w for _, _, w in items]), None)
            except Exception:  # a pool failure only costs speed: curves fits inline instead
                continue
            for i, (key, last_t, _) in enumerate(items):
                self._cache[key] = _CachedFit(now, last_t, n, fit.row(i))

    def _window(self, history: History) -> tuple[float, NDArray[np.float64]] | str:
        """The points Holt fits on (after the last gap, the latest `holt_fit_points`) and the time
        of the last one, or why there are none to fit."""
        p = self.params
        grid, gv = regularize(history.timestamps, history.values, history.step, history.max_gap)
        if grid.size < p.min_history_points:
            return (f"gap: only {grid.size} points since the last gap longer than "
                    f"{history.max_gap:.0f}s, need {p.min_history_points}")
        window = gv[-p.holt_fit_points :]
        if np.ptp(window) == 0:
            return "constant series: no trend to extrapolate"
        return float(grid[-1]), window

    def curves(self, key: str, history: History, now: float) -> Curves | str:
        p = self.params
        prepared = self._window(history)
        if isinstance(prepared, str):
            return prepared
        last_t, window = prepared
        cached = self._cache.get(key)
        if cached and (cached.at, cached.last_time, cached.size) == (now, last_t, window.size):
            fit = cached.fit
        else:
            fit = fit_holt(window)
        step = history.step
        steps = int(math.ceil((now + p.horizon_seconds - last_t) / step))
        point, se = holt_forecast(fit, max(steps, 1))
        sign = 1.0 if p.direction == "above" else -1.0
        times = last_t + step * np.arange(1, point.shape[1] + 1)
        info = {"model": "holt", "alpha": float(fit.alpha[0]), "beta": float(fit.beta[0]),
                "phi": float(fit.phi[0]), "sigma": float(fit.sigma[0]), "step_seconds": step}
        return Curves(times, point[0], point[0] + sign * self._z * se[0], info)
