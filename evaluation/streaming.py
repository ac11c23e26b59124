"""Stream a vectorized detector over one NAB series as the daemon would see it: at every record,
only the lookback up to it; then keep the cycles the daemon acts on after dedup (onsets)."""
from __future__ import annotations

from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

# NAB records are 5-30 min apart, tailguard's scrapes 5 s. Detector windows are in seconds, so
# each record is placed on a 5 s grid: every window then holds as many points as in production.
GRID_STEP_SECONDS = 5.0
CHUNK_ROWS = 4096  # cycles per vectorized call: bounds memory at ~10 MB per array

# (grid, [rows x points] lookbacks, now) -> (fired per row, episode start column per row or -1)
Decide = Callable[[NDArray[np.float64], NDArray[np.float64], float], tuple[NDArray[np.bool_], NDArray[np.int_]]]


def stream_onsets(decide: Decide, lookback_seconds: float,
                  values: NDArray[np.float64]) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """(fired per record, onset per record). An onset is a firing cycle whose episode start differs
    from the one of the last cycle that fired (whether or not the cycle just before fired): what
    the daemon acts on after dedup."""
    points = int(round(lookback_seconds / GRID_STEP_SECONDS))
    grid = np.arange(points) * GRID_STEP_SECONDS
    now = float(grid[-1])
    padded = np.concatenate([np.full(points - 1, np.nan), values])
    views = sliding_window_view(padded, points)  # row i = the lookback ending at record i
    fired = np.zeros(values.size, dtype=bool)
    start_abs = np.full(values.size, -1, dtype=np.int64)
    for lo in range(0, values.size, CHUNK_ROWS):
        rows_fired, rows_start = decide(grid, views[lo:lo + CHUNK_ROWS], now)
        rows = np.arange(lo, lo + rows_fired.size)
        fired[rows] = rows_fired
        start_abs[rows] = np.where(rows_fired, rows - (points - 1) + rows_start, -1)
    idx = np.where(fired, np.arange(values.size), -1)
    last_fired = np.maximum.accumulate(idx)
    prev_last = np.concatenate([[-1], last_fired[:-1]])
    prev_start = np.where(prev_last >= 0, start_abs[np.maximum(prev_last, 0)], -1)
    return fired, fired & (start_abs != prev_start)
