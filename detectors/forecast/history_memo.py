"""`CycleHistories`: each series' cleaned history and fitting window read once per cycle, shared
by `prepare` and `detect` (reading them was a third of a cached Holt cycle's cost, paid twice)."""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from core.query import Series
from detectors.forecast.arrays import History, read_history, window_of
from detectors.forecast.params import ForecastBreachParams

Window = tuple[NDArray[np.float64], NDArray[np.float64]]


class CycleHistories:
    """Histories of the current cycle by Series object: the poller hands `prepare` and `detect`
    the same objects at the same `now`, and a history is a pure function of the two. A new `now`
    starts over, so a memo holds one cycle's series at most; series are held, so an id is never
    reused while it is remembered."""

    def __init__(self, params: ForecastBreachParams) -> None:
        self._params = params
        self._now: float | None = None
        self._histories: dict[int, tuple[Series, History]] = {}
        self._windows: dict[tuple[int, int], tuple[History, Window]] = {}

    def _at(self, now: float) -> None:
        if now != self._now:
            self._now, self._histories, self._windows = now, {}, {}

    def read(self, series: Series, now: float) -> History:
        """`read_history(series, now, params)`, once per series and cycle (it raises ValueError
        for a malformed series, every time)."""
        self._at(now)
        seen = self._histories.get(id(series))
        if seen is not None and seen[0] is series:
            return seen[1]
        history = read_history(series, now, self._params)
        self._histories[id(series)] = (series, history)
        return history

    def window(self, history: History, points: int) -> Window:
        """`window_of(history, points)`, once per history of this cycle (the arrays are shared:
        callers only read them)."""
        key = (id(history), points)
        seen = self._windows.get(key)
        if seen is not None and seen[0] is history:
            return seen[1]
        window = window_of(history, points)
        self._windows[key] = (history, window)  # the history is held: its id stays its own
        return window
