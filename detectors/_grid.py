"""Many series onto one time grid as an [S x P] array: the input of the vectorized paths of the
tail and threshold detectors."""
from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.typing import NDArray

from core.query import Series


def align(series: Sequence[Series]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Series on one time grid, the union of their timestamps: [S x P], NaN where a series has no
    point. Range queries share a step, so the union is the query's grid.

    Raises on a malformed series (values and timestamps of different lengths, non-numbers): the
    per-series path reports those with a reason instead.
    """
    stamps = [np.asarray(s.timestamps, dtype=np.float64) for s in series]
    grid: NDArray[np.float64] = np.unique(np.concatenate(stamps)) if stamps else np.empty(0)
    values = np.full((len(series), grid.size), np.nan)
    for row, (s, ts) in enumerate(zip(series, stamps)):
        idx = np.searchsorted(grid, ts)
        ok = (idx < grid.size) & (grid[np.minimum(idx, grid.size - 1)] == ts)
        values[row, idx[ok]] = np.asarray(s.values, dtype=np.float64)[ok]
    return grid, values
