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

    Nearly every series of one range query has a point at every step: those rows are the grid
    itself, so the union is taken over the longest series and the rows that differ from it only,
    and the rows equal to the grid are converted together, as one block; the rest are placed
    point by point. Series sharing one timestamps object are converted and compared once.

    Raises on a malformed series (values and timestamps of different lengths, non-numbers): the
    per-series path reports those with a reason instead.
    """
    if not series:
        return np.empty(0), np.full((0, 0), np.nan)
    # Series of one answer may share one timestamps object (the range cache hands out one per
    # grid): converted and compared once. Ids are unique while `series` holds the objects.
    arrays: dict[int, NDArray[np.float64]] = {}
    stamps = []
    for s in series:
        ts = arrays.get(id(s.timestamps))
        if ts is None:
            ts = arrays[id(s.timestamps)] = np.asarray(s.timestamps, dtype=np.float64)
        stamps.append(ts)
    ref = max(stamps, key=len)
    equal: dict[int, bool] = {}
    same = []
    for ts in stamps:
        eq = equal.get(id(ts))
        if eq is None:
            eq = equal[id(ts)] = ts.size == ref.size and bool((ts == ref).all())
        same.append(eq)
    grid: NDArray[np.float64] = np.unique(np.concatenate([ref, *(ts for ts, eq in zip(stamps, same) if not eq)]))
    whole = grid.size == ref.size and bool((grid == ref).all())  # ref is sorted, without repeats
    rows = [row for row, (s, eq) in enumerate(zip(series, same)) if eq and whole and len(s.values) == grid.size]
    block = _block([series[row].values for row in rows], grid.size)
    if block is not None and len(rows) == len(series):
        return grid, block
    values = np.full((len(series), grid.size), np.nan)
    done: set[int] = set()
    if block is not None:
        values[rows] = block
        done = set(rows)
    for row, (s, ts, eq) in enumerate(zip(series, stamps, same)):
        if row in done:
            continue
        if eq and whole:
            row_values = np.asarray(s.values, dtype=np.float64)
            if row_values.shape == ts.shape:
                values[row] = row_values
                continue
        _place(values[row], grid, ts, s.values)
    return grid, values


def _block(rows: list[Sequence[float]], width: int) -> NDArray[np.float64] | None:
    """The rows that are the whole grid, converted in one call (one per row was most of `align`);
    None where that does not give one float per grid point of each row (a malformed value): the
    caller then converts row by row, as before, and raises what that raises."""
    if not rows:
        return None
    try:
        block = np.array(rows, dtype=np.float64)
    except Exception:  # whatever it is, the row by row path meets it again and raises it as before
        return None
    return block if block.shape == (len(rows), width) else None


def _place(row: NDArray[np.float64], grid: NDArray[np.float64], ts: NDArray[np.float64],
           values: Sequence[float]) -> None:
    """One series' points into its row of the grid, each at its timestamp."""
    if len(values) != ts.size:
        raise ValueError(f"timestamps and values of different lengths ({ts.size} and {len(values)})")
    idx = np.searchsorted(grid, ts)
    ok = (idx < grid.size) & (grid[np.minimum(idx, grid.size - 1)] == ts)
    row[idx[ok]] = np.asarray(values, dtype=np.float64)[ok]


def align_pointwise(series: Sequence[Series]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """`align` placing every series point by point (no whole-row copies): its reference, kept to
    check the fast path against."""
    stamps = [np.asarray(s.timestamps, dtype=np.float64) for s in series]
    grid: NDArray[np.float64] = np.unique(np.concatenate(stamps)) if stamps else np.empty(0)
    values = np.full((len(series), grid.size), np.nan)
    for row, (s, ts) in enumerate(zip(series, stamps)):
        _place(values[row], grid, ts, s.values)
    return grid, values
