"""Cumulative counters -> per-step increments, vectorized over series: the input of `tail_excess`.

Counters come as raw samples (a range query of the counter itself, or a direct scrape), not as
`rate()`: the detector then sees every step's exact increment, and a gap or a reset costs one step
instead of a whole rate window.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class Steps:
    """Increments of a latency counter and its request counter, [S x P] on the shared grid.

    Column j holds the increment from the previous valid sample of the row to sample j; NaN where
    there is no sample at j or none before it. `resets` marks columns where either counter went
    down (a server restart): as Prometheus' `increase()` does, the new value is the increment.
    """

    latency: NDArray[np.float64]
    requests: NDArray[np.float64]
    resets: NDArray[np.bool_]
    first_valid: NDArray[np.int_]  # (S,) first column with both counters, -1 if none
    last_valid: NDArray[np.int_]  # (S,) last column with both counters, -1 if none


def counter_steps(latency: NDArray[np.float64], requests: NDArray[np.float64]) -> Steps:
    """Per-step increments of two counters sampled on one grid ([S x P] each, NaN = no sample).

    A column counts only where both counters have a sample, so a latency increment is always
    divided by the request increment of the very same interval.

    Nearly every row has both samples at every column: there the previous sample is the previous
    column, a plain difference (`_dense_steps`); only the rows with a gap take the general path,
    which finds each column's previous sample (`_sparse_steps`). Both give the same numbers on a
    row without gaps."""
    if latency.shape != requests.shape:
        raise ValueError(f"counter shapes differ: {latency.shape} vs {requests.shape}")
    valid = np.isfinite(latency) & np.isfinite(requests)
    gaps = np.flatnonzero(~valid.all(axis=1))
    # Not float64 (the dtypes numpy then picks are the general path's own), no column (it raises,
    # as it always did), or no row without a gap: the general path only.
    if (latency.dtype != np.float64 or requests.dtype != np.float64 or latency.shape[1] == 0
            or gaps.size == latency.shape[0]):
        d_lat, d_req, resets = _sparse_steps(latency, requests, valid)
    else:
        d_lat, d_req, resets = _dense_steps(latency, requests)
        if gaps.size:
            d_lat[gaps], d_req[gaps], resets[gaps] = _sparse_steps(latency[gaps], requests[gaps], valid[gaps])
    cols = valid.shape[1]
    seen = valid.any(axis=1)
    first = np.where(seen, np.argmax(valid, axis=1), -1)
    last = np.where(seen, cols - 1 - np.argmax(valid[:, ::-1], axis=1), -1) if cols else first
    return Steps(d_lat, d_req, resets, first, last)


Increments = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]


def _dense_steps(latency: NDArray[np.float64], requests: NDArray[np.float64]) -> Increments:
    """Increments (latency, requests, resets) of rows with a sample of both counters at every
    column: column j minus column j - 1; the first column has none."""
    rows, cols = latency.shape
    d_lat, d_req = np.empty((rows, cols)), np.empty((rows, cols))
    d_lat[:, :1] = np.nan
    d_req[:, :1] = np.nan
    resets = np.zeros((rows, cols), dtype=bool)
    if cols > 1:
        with np.errstate(invalid="ignore"):  # inf - inf: only in rows with a gap, which are taken anew
            np.subtract(latency[:, 1:], latency[:, :-1], out=d_lat[:, 1:])
            np.subtract(requests[:, 1:], requests[:, :-1], out=d_req[:, 1:])
        went_down = (d_lat[:, 1:] < 0) | (d_req[:, 1:] < 0)
        resets[:, 1:] = went_down
        if went_down.any():  # restarts are rare: where one is, the new value is the increment
            np.copyto(d_lat[:, 1:], latency[:, 1:], where=went_down)
            np.copyto(d_req[:, 1:], requests[:, 1:], where=went_down)
    return d_lat, d_req, resets


def _sparse_steps(latency: NDArray[np.float64], requests: NDArray[np.float64],
                  valid: NDArray[np.bool_]) -> Increments:
    """Increments (latency, requests, resets) of any rows: each column from the row's previous
    column with both samples (`valid`)."""
    rows, cols = latency.shape
    col_idx = np.broadcast_to(np.arange(cols), (rows, cols))
    last_valid = np.maximum.accumulate(np.where(valid, col_idx, -1), axis=1)
    prev = np.concatenate([np.full((rows, 1), -1), last_valid[:, :-1]], axis=1)
    has_prev = valid & (prev >= 0)
    safe_prev = np.maximum(prev, 0)
    d_lat = latency - np.take_along_axis(latency, safe_prev, axis=1)
    d_req = requests - np.take_along_axis(requests, safe_prev, axis=1)
    resets = has_prev & ((d_lat < 0) | (d_req < 0))
    d_lat = np.where(resets, latency, d_lat)
    d_req = np.where(resets, requests, d_req)
    d_lat = np.where(has_prev, d_lat, np.nan)
    d_req = np.where(has_prev, d_req, np.nan)
    return d_lat, d_req, resets
