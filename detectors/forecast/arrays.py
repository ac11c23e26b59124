"""Array helpers that turn a raw series into what the forecasters fit on: cleaned history, its
step, and a regular grid."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.typing import NDArray

from core.query import Series
from detectors.forecast.params import ForecastBreachParams


@dataclass(frozen=True)
class History:
    """One series' cleaned history (see `clean_history`): ascending, finite, within the lookback."""

    timestamps: NDArray[np.float64]
    values: NDArray[np.float64]
    step: float  # the sampling step, given or inferred
    max_gap: float  # a longer run of missed scrapes breaks the history
    max_staleness: float  # a newest point older than this is stale data


def read_history(series: Series, now: float, params: ForecastBreachParams) -> History:
    """The series' history as the parameters ask for it; raises ValueError if it is malformed."""
    ts, vs = clean_history(series.timestamps, series.values, now, params.lookback_seconds)
    step = params.step_seconds or infer_step(ts)
    return History(ts, vs, step, params.gap_seconds(step), params.staleness_seconds(step))


def window_of(history: History, points: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The grid the forecasters fit on: the history after its last long gap, regular, the latest
    `points` of it (shorter gaps linearly interpolated)."""
    grid, values = regularize(history.timestamps, history.values, history.step, history.max_gap)
    return grid[-points:], values[-points:]


def clean_history(
    timestamps: Sequence[float] | NDArray[np.float64], values: Sequence[float] | NDArray[np.float64], now: float,
    lookback_seconds: float,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Finite points within ``[now - lookback, now]``, sorted, one per timestamp (the last wins)."""
    ts = np.asarray(timestamps, dtype=np.float64).ravel()
    vs = np.asarray(values, dtype=np.float64).ravel()
    if ts.size != vs.size:
        raise ValueError(f"{ts.size} timestamps but {vs.size} values")
    keep = np.isfinite(ts) & np.isfinite(vs) & (ts <= now) & (ts >= now - lookback_seconds)
    ts, vs = ts[keep], vs[keep]
    order = np.argsort(ts, kind="stable")
    ts, vs = ts[order], vs[order]
    if ts.size > 1:
        last_of_run = np.append(ts[1:] != ts[:-1], True)
        ts, vs = ts[last_of_run], vs[last_of_run]
    return ts, vs


def infer_step(timestamps: NDArray[np.float64]) -> float:
    """Median spacing of ascending timestamps (a Prometheus range query's step)."""
    d = np.diff(timestamps)
    return float(np.median(d)) if d.size else 0.0


def regularize(
    timestamps: NDArray[np.float64], values: NDArray[np.float64], step: float, max_gap: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The series on a grid of ``step`` ending at its last point, linearly interpolated,
    keeping only the stretch after the last gap longer than ``max_gap`` (the forecasters have no
    notion of missing data, and bridging a long gap with a straight line would invent a trend)."""
    if timestamps.size < 2:
        return timestamps.copy(), values.copy()
    grid = regular_grid(timestamps, step, max_gap)
    return grid, np.interp(grid, timestamps, values)


def regular_grid(timestamps: NDArray[np.float64], step: float, max_gap: float) -> NDArray[np.float64]:
    """`regularize`'s grid of at least two ascending timestamps (it depends on them alone)."""
    big = np.nonzero(np.diff(timestamps) > max_gap)[0]
    start = timestamps[big[-1] + 1] if big.size else timestamps[0]
    n = int(math.floor((timestamps[-1] - start) / step + 1e-9)) + 1
    grid: NDArray[np.float64] = timestamps[-1] - step * np.arange(n - 1, -1, -1, dtype=np.float64)
    return grid


def aligned(grid: NDArray[np.float64], history: History) -> NDArray[np.float64]:
    """Another series (a companion: the request rate beside a latency) on this grid, linearly
    interpolated; NaN at grid points its own history does not cover (before its first point after
    its last long gap, or after its last point)."""
    ts, vs = history.timestamps, history.values
    if ts.size < 2:
        return np.full(grid.shape, np.nan)
    start = regular_grid(ts, history.step, history.max_gap)[0]
    keep = ts >= start
    out = np.interp(grid, ts[keep], vs[keep], left=np.nan, right=np.nan)
    return np.asarray(out, dtype=np.float64)
