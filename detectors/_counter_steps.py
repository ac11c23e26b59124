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


def counter_steps(latency: NDArray[np.float64], requests: NDArray[np.float64]) -> Steps:
    """Per-step increments of two counters sampled on one grid ([S x P] each, NaN = no sample).

    A column counts only where both counters have a sample, so a latency increment is always
    divided by the request increment of the very same interval.
    """
    if latency.shape != requests.shape:
        raise ValueError(f"counter shapes differ: {latency.shape} vs {requests.shape}")
    rows, cols = latency.shape
    valid = np.isfinite(latency) & np.isfinite(requests)
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
    first = np.where(valid.any(axis=1), np.argmax(valid, axis=1), -1)
    return Steps(d_lat, d_req, resets, first)
