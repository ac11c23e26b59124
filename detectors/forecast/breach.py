"""Breach logic shared by every forecaster: when a curve first crosses the threshold, and which
episode (the dedup key) a predicted breach belongs to."""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def first_crossing(
    times: NDArray[np.float64], curve: NDArray[np.float64], threshold: float, direction: str,
    start_time: float, start_value: float,
) -> float | None:
    """Time the curve first reaches the threshold, linearly interpolated from the point before
    (the first forecast point is interpolated from ``(start_time, start_value)``); None if never."""
    sign = 1.0 if direction == "above" else -1.0
    over = sign * (curve - threshold) >= 0
    hits = np.nonzero(over)[0]
    if not hits.size:
        return None
    i = int(hits[0])
    t0, v0 = (start_time, start_value) if i == 0 else (float(times[i - 1]), float(curve[i - 1]))
    t1, v1 = float(times[i]), float(curve[i])
    if v1 == v0 or sign * (v0 - threshold) >= 0:
        return t1 if sign * (v0 - threshold) < 0 else t0
    return t0 + (threshold - v0) / (v1 - v0) * (t1 - t0)


class Episodes:
    """Episode starts per series key, stable across cycles so re-detections dedup. A forecast
    that flickers off for up to ``gap_seconds`` (one horizon) is the same incident, not a new one."""

    def __init__(self, gap_seconds: float) -> None:
        self._gap = gap_seconds
        self._open: dict[str, tuple[float, float]] = {}  # key -> (start, last active)

    def touch(self, key: str, now: float) -> float:
        """The episode's start; a new one unless the last was active within the gap."""
        ep = self._open.get(key)
        start = now if ep is None or now - ep[1] > self._gap else ep[0]
        self._open[key] = (start, now)
        return start

    def close(self, key: str, now: float) -> None:
        """Forget an episode inactive for longer than the gap (a shorter lull keeps it)."""
        ep = self._open.get(key)
        if ep is not None and now - ep[1] > self._gap:
            del self._open[key]
