"""The Holt backend: damped-trend Holt that does not learn a trend from jumps (holt_fit), its
parameters refitted on a staggered slot per series, its states filtered again every cycle, and its
distribution calibrated on the series' own past errors (calibration). One batched pool job per
cycle for many series (windows of any length, NaN-padded); inline for a few."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.typing import NDArray

from core.query import Series, series_key
from detectors.base import Offload
from detectors.forecast.arrays import History, read_history, window_of
from detectors.forecast.calibration import PathForecast, level_points
from detectors.forecast.holt_paths import HoltBatch, HoltParams, holt_batch, holt_fit_params, holt_paths, holt_prepare
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.refit_schedule import refit_due, refit_phase_seconds

# Below this many series, shipping a batch to the pool costs more than filtering inline.
_BATCH_MIN = 16
ERROR_HALF_LIFE_PATHS = 1e9
"""Past error paths count equally (a half-life in origins would weight the recent past more)."""


@dataclass
class _Fitted:
    params: HoltParams
    fitted_at: float
    phase: float
    last_seen: float


@dataclass(frozen=True)
class _Prepared:
    """States from this cycle's `prepare`, valid only for the same cycle and the same window."""

    at: float
    last_time: float
    size: int
    batch: HoltBatch


class HoltForecaster:
    """Parameters change slowly and are refitted once per `holt_refit_seconds` (a restart refits
    them from the range at once); states and the distribution are recomputed every cycle."""

    def __init__(self, params: ForecastBreachParams) -> None:
        self.params = params
        self._fitted: dict[str, _Fitted] = {}
        self._prepared: dict[str, _Prepared] = {}

    def _window(self, history: History) -> tuple[NDArray[np.float64], NDArray[np.float64]] | str:
        p = self.params
        grid, values = window_of(history, p.holt_fit_points)
        if grid.size < p.min_history_points:
            return (f"gap: only {grid.size} points since the last gap longer than "
                    f"{history.max_gap:.0f}s, need {p.min_history_points}")
        if np.ptp(values) == 0:
            return "constant series: no trend to extrapolate"
        return grid, values

    def _due(self, key: str, now: float) -> bool:
        f = self._fitted.get(key)
        return f is None or refit_due(f.fitted_at, f.phase, self.params.holt_refit_seconds, now)

    def _remember(self, key: str, params: HoltParams, refitted: bool, now: float) -> None:
        f = self._fitted.get(key)
        if f is None:
            self._fitted[key] = _Fitted(params, now, refit_phase_seconds(key, self.params.holt_refit_seconds), now)
            return
        f.last_seen = now
        if refitted:
            f.params, f.fitted_at = params, now

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        """One pool job for the cycle: refit the due series' parameters, filter every series."""
        self._prepared = {}
        items: list[tuple[str, float, NDArray[np.float64], float]] = []
        for s in batch:
            try:
                history = read_history(s, now, self.params)
            except ValueError:  # malformed series: detect reports it
                continue
            if history.timestamps.size < self.params.min_history_points:
                continue
            window = self._window(history)
            if not isinstance(window, str):
                items.append((series_key(s.labels), float(window[0][-1]), window[1], history.step))
        self._forget(now)
        if len(items) < _BATCH_MIN:
            return  # forecast filters these inline
        width = max(w.size for _, _, w, _ in items)
        windows = np.full((len(items), width), np.nan)
        for i, (_, _, w, _) in enumerate(items):
            windows[i, width - w.size :] = w
        steps = np.array([step for _, _, _, step in items])
        refit = np.array([self._due(k, now) for k, _, _, _ in items])
        kept = [self._fitted[k].params if not r else None for (k, _, _, _), r in zip(items, refit)]
        alpha, beta, phi = (np.array([np.nan if c is None else float(getattr(c, f)[0]) for c in kept])
                            for f in ("alpha", "beta", "phi"))
        try:
            result: HoltBatch = await offload(holt_prepare, windows, steps, refit, alpha, beta, phi)
        except Exception:  # a pool failure only costs speed: forecast filters inline instead
            return
        for i, (key, last_t, w, _) in enumerate(items):
            row = result.row(i)
            start = width - w.size
            trimmed = HoltBatch(row.params, row.levels[:, start:], row.trends[:, start:])
            self._remember(key, row.params, bool(refit[i]), now)
            self._prepared[key] = _Prepared(now, last_t, w.size, trimmed)

    def _forget(self, now: float) -> None:
        for key in [k for k, f in self._fitted.items() if now - f.last_seen > self.params.lookback_seconds]:
            del self._fitted[key]  # series gone for a whole lookback: forget its parameters

    def forecast(self, key: str, history: History, now: float) -> PathForecast | str:
        p = self.params
        window = self._window(history)
        if isinstance(window, str):
            return window
        grid, values = window
        last_t = float(grid[-1])
        prepared = self._prepared.get(key)
        if prepared and (prepared.at, prepared.last_time, prepared.size) == (now, last_t, values.size):
            batch = prepared.batch
        else:
            due = self._due(key, now)
            params = holt_fit_params(values[None], history.step) if due else self._fitted[key].params
            self._remember(key, params, due, now)
            batch = holt_batch(values[None], history.step, params)
        step = history.step
        steps = max(1, int(math.ceil((now + p.horizon_seconds - last_t) / step - 1e-9)))
        points = level_points(p.level_window_seconds, step)
        relative = p.errors == "relative"
        point, errors = holt_paths(batch, values[None], steps, points, relative)
        info = {"model": "holt", "alpha": float(batch.params.alpha[0]), "beta": float(batch.params.beta[0]),
                "phi": float(batch.params.phi[0]), "step_seconds": step, "level_points": points}
        return PathForecast.from_errors(last_t, step, point[0], errors[0], relative, ERROR_HALF_LIFE_PATHS, info)
