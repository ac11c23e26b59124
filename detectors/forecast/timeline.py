"""`Timeline`: the part of reading a history (`read_history`, `window_of`) that depends on the
timestamps alone, computed once for every series of a cycle that shares one timestamps object (a
range query's series mostly do). A series then costs a gather and an interpolation, with the
same result as reading it alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.typing import NDArray

from detectors.forecast.arrays import History, clean_history, infer_step, regular_grid
from detectors.forecast.params import ForecastBreachParams

FLOAT = NDArray[np.float64]


@dataclass(frozen=True)
class Timeline:
    """Cleaned timestamps and their grid, and where each cleaned point sits in the raw arrays."""

    size: int  # raw points
    keep: NDArray[np.bool_]  # raw points with a finite timestamp within the lookback
    take: NDArray[np.intp]  # raw index of each cleaned point (sorted, the last of equal timestamps)
    timestamps: FLOAT  # cleaned, as `clean_history` gives them when every kept value is finite
    step: float
    max_gap: float
    max_staleness: float
    grid: FLOAT  # `regularize`'s grid: after the last long gap, ending at the last point


def timeline_of(timestamps: Sequence[float], now: float, params: ForecastBreachParams) -> Timeline:
    """What `read_history` and `regularize` compute from these timestamps (ValueError or TypeError
    as `read_history` raises them)."""
    raw = np.asarray(timestamps, dtype=np.float64).ravel()
    keep = np.isfinite(raw) & (raw <= now) & (raw >= now - params.lookback_seconds)
    # The raw indices go through `clean_history` as values: its gathers move them exactly.
    ts, at = clean_history(raw, np.arange(raw.size, dtype=np.float64), now, params.lookback_seconds)
    step = params.step_seconds or infer_step(ts)
    max_gap = params.gap_seconds(step)
    grid = regular_grid(ts, step, max_gap) if ts.size >= 2 else ts
    return Timeline(raw.size, keep, at.astype(np.intp), ts, step, max_gap, params.staleness_seconds(step), grid)


def history_on(timeline: Timeline, values: Sequence[float]) -> History | None:
    """`read_history` of a series with these values on this timeline, or None when it would not
    be a gather (a length mismatch, or a non-finite kept value drops a point): read it alone."""
    vs = np.asarray(values, dtype=np.float64).ravel()
    if vs.size != timeline.size or not np.isfinite(vs[timeline.keep]).all():
        return None
    return History(timeline.timestamps, vs[timeline.take], timeline.step, timeline.max_gap, timeline.max_staleness)


def window_on(timeline: Timeline, history: History, points: int) -> tuple[FLOAT, FLOAT]:
    """`window_of(history, points)` of a history read on this timeline: the grid's tail is shared,
    and only its points are interpolated (np.interp reads each point on its own)."""
    if timeline.timestamps.size < 2:
        return timeline.timestamps.copy()[-points:], history.values.copy()[-points:]
    grid = timeline.grid[-points:]
    return grid, np.interp(grid, timeline.timestamps, history.values)
