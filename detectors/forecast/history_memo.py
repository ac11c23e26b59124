"""`CycleHistories`: each series' cleaned history and fitting window read once per cycle, shared
by `prepare` and `detect` (reading them was a third of a cached Holt cycle's cost, paid twice);
series sharing one timestamps object share its `Timeline` (the timestamps' part of the reading)."""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from core.query import Series, series_key
from detectors.forecast.arrays import History, read_history, window_of
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.timeline import Timeline, history_on, timeline_of, window_on

Window = tuple[NDArray[np.float64], NDArray[np.float64]]


class CycleHistories:
    """Histories of the current cycle by Series object: the poller hands `prepare` and `detect`
    the same objects at the same `now`, and a history is a pure function of the two. A new `now`
    starts over, so a memo holds one cycle's series at most; series (and timestamps objects) are
    held, so an id is never reused while it is remembered."""

    def __init__(self, params: ForecastBreachParams) -> None:
        self._params = params
        self._now: float | None = None
        self._histories: dict[int, tuple[Series, History]] = {}
        self._windows: dict[tuple[int, int], tuple[History, Window]] = {}
        self._timelines: dict[int, tuple[Any, Timeline | None]] = {}
        self._timeline_of: dict[int, tuple[History, Timeline]] = {}
        self._keys: dict[int, tuple[Series, str]] = {}

    def _at(self, now: float) -> None:
        if now != self._now:
            self._now, self._histories, self._windows = now, {}, {}
            self._timelines, self._timeline_of, self._keys = {}, {}, {}

    def key(self, series: Series, now: float) -> str:
        """`series_key(series.labels)`, once per series and cycle (`prepare` and `detect` both ask)."""
        self._at(now)
        seen = self._keys.get(id(series))
        if seen is not None and seen[0] is series:
            return seen[1]
        key = series_key(series.labels)
        self._keys[id(series)] = (series, key)
        return key

    def read(self, series: Series, now: float) -> History:
        """`read_history(series, now, params)`, once per series and cycle (it raises ValueError
        for a malformed series, every time)."""
        self._at(now)
        seen = self._histories.get(id(series))
        if seen is not None and seen[0] is series:
            return seen[1]
        timeline = self._timeline(series.timestamps, now)
        on = history_on(timeline, series.values) if timeline is not None else None
        if timeline is not None and on is not None:
            history = on
            self._timeline_of[id(history)] = (history, timeline)
        else:
            history = read_history(series, now, self._params)
        self._histories[id(series)] = (series, history)
        return history

    def _timeline(self, timestamps: Any, now: float) -> Timeline | None:
        """The timestamps' `Timeline`, once per object and cycle; None when reading them fails
        (`read_history` then raises the same error for each series)."""
        seen = self._timelines.get(id(timestamps))
        if seen is not None and seen[0] is timestamps:
            return seen[1]
        try:
            timeline: Timeline | None = timeline_of(timestamps, now, self._params)
        except (TypeError, ValueError):
            timeline = None
        self._timelines[id(timestamps)] = (timestamps, timeline)
        return timeline

    def window(self, history: History, points: int) -> Window:
        """`window_of(history, points)`, once per history of this cycle (the arrays are shared:
        callers only read them)."""
        key = (id(history), points)
        seen = self._windows.get(key)
        if seen is not None and seen[0] is history:
            return seen[1]
        on = self._timeline_of.get(id(history))
        if on is not None and on[0] is history:
            window = window_on(on[1], history, points)
        else:
            window = window_of(history, points)
        self._windows[key] = (history, window)  # the history is held: its id stays its own
        return window
