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

from core.query import Series
from detectors.base import Offload
from detectors.forecast.arrays import History, aligned
from detectors.forecast.calibration import PathForecast, level_points, level_weights
from detectors.forecast.holt_cycle import (ERROR_HALF_LIFE_PATHS, CycleRows, HoltCycle, Question, Rates, holt_cycle,
                                           knee_info)
from detectors.forecast.history_memo import CycleHistories
from detectors.forecast.holt_paths import (HoltParams, holt_batch, holt_fit_params, holt_load_fit_params,
                                           holt_load_paths, holt_paths)
from detectors.forecast.outlook import Outlook, outlook_of
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.refit_schedule import refit_due, refit_phase_seconds

__all__ = ["ERROR_HALF_LIFE_PATHS", "HoltForecaster"]

# Below this many series, shipping a batch to the pool costs more than filtering inline.
_BATCH_MIN = 16


@dataclass
class _Fitted:
    params: HoltParams
    fitted_at: float
    phase: float
    last_seen: float
    rate_params: HoltParams | None = None  # the log rate's, for a series with a rate beside it


@dataclass(frozen=True)
class _Prepared:
    """The outlook from this cycle's `prepare`, valid only for the same cycle and the same window."""

    at: float
    last_time: float
    size: int
    step: float
    outlook: Outlook
    with_rate: bool = False  # read with a rate beside the series


def _columns(kept: Sequence[HoltParams | None]) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Kept one-row parameters as (alpha, beta, phi) arrays, NaN where none is kept (refitted)."""
    def column(field: str) -> NDArray[np.float64]:
        return np.array([np.nan if c is None else float(getattr(c, field)[0]) for c in kept])

    return column("alpha"), column("beta"), column("phi")


class HoltForecaster:
    """Parameters change slowly and are refitted once per `holt_refit_seconds` (a restart refits
    them from the range at once); states and the distribution are recomputed every cycle."""

    def __init__(self, params: ForecastBreachParams, histories: CycleHistories | None = None) -> None:
        self.params = params
        self._histories = histories if histories is not None else CycleHistories(params)
        self._fitted: dict[str, _Fitted] = {}
        self._prepared: dict[str, _Prepared] = {}

    def _window(self, history: History) -> tuple[NDArray[np.float64], NDArray[np.float64]] | str:
        p = self.params
        grid, values = self._histories.window(history, p.holt_fit_points)
        if grid.size < p.min_history_points:
            return (f"gap: only {grid.size} points since the last gap longer than "
                    f"{history.max_gap:.0f}s, need {p.min_history_points}")
        if values.max() == values.min():  # np.ptp(values) == 0: the last value is finite, NaN fails both
            return "constant series: no trend to extrapolate"
        return grid, values

    def _due(self, key: str, now: float) -> bool:
        f = self._fitted.get(key)
        return f is None or refit_due(f.fitted_at, f.phase, self.params.holt_refit_seconds, now)

    def _remember(self, key: str, params: HoltParams, refitted: bool, now: float,
                  rate_params: HoltParams | None = None) -> None:
        f = self._fitted.get(key)
        if f is None:
            self._fitted[key] = _Fitted(params, now, refit_phase_seconds(key, self.params.holt_refit_seconds), now,
                                        rate_params)
            return
        f.last_seen = now
        if refitted:
            f.params, f.fitted_at = params, now
        if rate_params is not None:
            f.rate_params = rate_params

    def _rate(self, grid: NDArray[np.float64], load: Series | History | None, now: float
              ) -> NDArray[np.float64] | None:
        """The request rate beside a series on its window's grid (NaN where its history does not
        cover it), or None without one (or when it cannot be read)."""
        if load is None:
            return None
        if isinstance(load, History):
            return aligned(grid, load)
        try:
            return aligned(grid, self._histories.read(load, now))
        except ValueError:  # a malformed rate: the latency is forecast alone
            return None

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload,
                      loads: Sequence[Series | None] | None = None) -> None:
        """One pool job for the cycle: refit the due series' parameters, filter every series and
        read its outlook (what `forecast` would compute per series, for all of them at once).
        `loads[i]` is the request rate beside `batch[i]` (the capacity knee), None for none."""
        self._prepared = {}
        items: list[tuple[str, float, float, NDArray[np.float64]]] = []
        rates: list[NDArray[np.float64] | None] = []
        for i, s in enumerate(batch):
            try:
                history = self._histories.read(s, now)
            except ValueError:  # malformed series: detect reports it
                continue
            if history.timestamps.size < self.params.min_history_points:
                continue
            window = self._window(history)
            if not isinstance(window, str):
                items.append((self._histories.key(s, now), float(window[0][-1]), history.step, window[1]))
                rates.append(self._rate(window[0], loads[i] if loads is not None else None, now))
        self._forget(now)
        if len(items) < _BATCH_MIN:
            return  # forecast filters these inline
        width = max(w.size for *_, w in items)
        windows = np.full((len(items), width), np.nan)
        for i, (*_, w) in enumerate(items):
            windows[i, width - w.size :] = w
        beside = None
        if any(r is not None for r in rates):
            values = np.full(windows.shape, np.nan)
            for i, r in enumerate(rates):
                if r is not None:
                    values[i, width - r.size :] = r
            kept_rates = [self._fitted[k].rate_params if k in self._fitted else None for k, *_ in items]
            beside = Rates(values, HoltParams(*_columns(kept_rates)))
        refit = np.array([self._due(k, now) for k, *_ in items])
        kept = [self._fitted[k].params if not r else None for (k, *_), r in zip(items, refit)]
        alpha, beta, phi = _columns(kept)
        p = self.params
        rows = CycleRows(
            sizes=np.array([w.size for *_, w in items], dtype=np.intp),
            starts=np.array([t for _, t, _, _ in items]),
            steps=np.array([st for _, _, st, _ in items]),
            horizons=np.array([self._horizon_steps(now, t, st) for _, t, st, _ in items], dtype=np.intp),
            points=np.array([level_points(p.level_window_seconds, st) for _, _, st, _ in items], dtype=np.intp),
        )
        question = Question(p.threshold, p.direction, p.errors == "relative")
        try:
            result: HoltCycle = await offload(holt_cycle, windows, refit, alpha, beta, phi, rows, question, beside)
        except Exception:  # a pool failure only costs speed: forecast filters inline instead
            return
        for i, (key, last_t, step, w) in enumerate(items):
            rate_params = result.rate_params.row(i) if result.rate_params is not None else None
            if rate_params is not None and not np.isfinite(rate_params.alpha[0]):
                rate_params = None
            self._remember(key, result.params.row(i), bool(refit[i]), now, rate_params)
            self._prepared[key] = _Prepared(now, last_t, w.size, step, result.outlooks[i], rates[i] is not None)

    def _horizon_steps(self, now: float, last_t: float, step: float) -> int:
        """Grid steps from the window's last point to now + horizon (at least one)."""
        return max(1, int(math.ceil((now + self.params.horizon_seconds - last_t) / step - 1e-9)))

    def _forget(self, now: float) -> None:
        for key in [k for k, f in self._fitted.items() if now - f.last_seen > self.params.lookback_seconds]:
            del self._fitted[key]  # series gone for a whole lookback: forget its parameters

    def forecast(self, key: str, history: History, now: float, load: History | None = None) -> Outlook | str:
        p = self.params
        window = self._window(history)
        if isinstance(window, str):
            return window
        grid, values = window
        last_t = float(grid[-1])
        step = history.step
        prepared = self._prepared.get(key)
        if prepared and (prepared.at, prepared.last_time, prepared.size, prepared.step, prepared.with_rate) == (
                now, last_t, values.size, step, load is not None):
            return prepared.outlook
        rate = self._rate(grid, load, now)
        if rate is not None:
            return self._forecast_with_rate(key, values, rate, last_t, step, now)
        due = self._due(key, now)
        params = holt_fit_params(values[None], step) if due else self._fitted[key].params
        self._remember(key, params, due, now)
        batch = holt_batch(values[None], step, params)
        steps = self._horizon_steps(now, last_t, step)
        points = level_points(p.level_window_seconds, step)
        relative = p.errors == "relative"
        point, errors = holt_paths(batch, values[None], steps, points, relative)
        info = {"model": "holt", "alpha": float(batch.params.alpha[0]), "beta": float(batch.params.beta[0]),
                "phi": float(batch.params.phi[0]), "step_seconds": step, "level_points": points}
        local = level_weights(values, errors.shape[1], steps, points)
        forecast = PathForecast.from_errors(last_t, step, point[0], errors[0], relative, ERROR_HALF_LIFE_PATHS, info,
                                            local)
        return outlook_of(forecast, p.threshold, p.direction)

    def _forecast_with_rate(self, key: str, values: NDArray[np.float64], rate: NDArray[np.float64], last_t: float,
                            step: float, now: float) -> Outlook:
        """`forecast` of one series with its request rate beside it: through the knee where the
        rate explains the latency (detectors/forecast/load_knee.py), as plain Holt elsewhere."""
        p = self.params
        due = self._due(key, now)
        kept = self._fitted.get(key)
        if due or kept is None:
            params, rate_params = holt_load_fit_params(values[None], rate[None], step)
        else:
            params, rate_params = kept.params, kept.rate_params
            if rate_params is None:
                _, rate_params = holt_load_fit_params(values[None], rate[None], step)
        self._remember(key, params, due or kept is None, now, rate_params)
        steps = self._horizon_steps(now, last_t, step)
        points = level_points(p.level_window_seconds, step)
        relative = p.errors == "relative"
        point, errors, knee = holt_load_paths(values[None], rate[None], params, rate_params, step, steps, points,
                                              relative, p.threshold)
        used = bool(knee.usable[0]) and rate_params is not None and bool(np.isfinite(rate_params.alpha[0]))
        info = {"model": "holt", "alpha": float(params.alpha[0]), "beta": float(params.beta[0]),
                "phi": float(params.phi[0]), "step_seconds": step, "level_points": points,
                "knee": knee_info(knee, 0, used)}
        local = level_weights(values, errors.shape[1], steps, points)
        forecast = PathForecast.from_errors(last_t, step, point[0], errors[0], relative, ERROR_HALF_LIFE_PATHS, info,
                                            local)
        return outlook_of(forecast, p.threshold, p.direction)
