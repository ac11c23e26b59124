"""When a started version's settle ends: once the requests its own model load held are answered.

Triton holds the requests that arrive while a version loads and answers them together when the
load ends; the version's request counter first moves then (its start). A busy node drains that
backlog over a few more seconds, and where several instances serve, fresh requests interleave with
held ones, so the held share falls step by step (100%, 75%, 50%, 25%) rather than at once. So the
settle ends at the end of the first step after the start's whose requests were all but clear of
the hold: fewer than a tenth above the line on a histogram, a mean below a tenth of the line on
counters (by Markov's inequality fewer than a tenth can then be above it; a bulk slower than that
runs every settle to its longest). That step is not scored either (a drain's last held requests may
sit in it); from the next one on, every step is, as with no load at all. A defect at 0.5% holds a
tenth of a 40-request step about once in 10,000 steps: the settle costs it one step. `start_settle_seconds` is the longest a settle lasts. The end is a
stopping time of the version's own steps, and later steps are independent of it, so the start
test's per-deploy bound holds from wherever it begins.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

HELD_SHARE = 0.1
"""A step ends the settle when fewer than this share of its requests can be above the line."""


def may_be_held(evidence: str, line: float, d_primary: NDArray[np.float64],
                d_requests: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Per step, whether a tenth or more of its requests may be held ones (also where it has none,
    or no sample): `d_primary` is the step's increment of the bucket at the line (histogram) or of the
    latency counter (counters, in the line's unit), `d_requests` of the request counter."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if evidence == "histogram":
            clear = (d_requests - d_primary) < HELD_SHARE * d_requests
        else:
            clear = d_primary < HELD_SHARE * line * d_requests
    held: NDArray[np.bool_] = ~(clear & (d_requests > 0) & np.isfinite(d_primary))
    return held


def settle_end(grid: NDArray[np.float64], at: float, longest: float, primary: NDArray[np.float64],
               totals: NDArray[np.float64], evidence: str, line: float) -> float:
    """When the settle of a version that started at `at` ends, from its summed cumulative counters
    [P] on `grid`: the end of the first step beginning at or after the start whose requests were
    all but clear of the hold, or `at + longest`, whichever comes first."""
    cap = at + longest
    if grid.size < 2:
        return cap
    held = may_be_held(evidence, line, np.diff(primary), np.diff(totals))
    begins, ends = grid[:-1], grid[1:]
    clear = np.flatnonzero(~held & (begins >= at - 1e-9) & (ends <= cap + 1e-9))
    return float(ends[clear[0]]) if clear.size else cap


def settle_columns(held: NDArray[np.bool_], longest_col: int) -> NDArray[np.int_]:
    """Per row of steps [R x C] whose column 0 holds the first request (a replay's layout): the
    column whose end ends the settle, the first column from 1 that was all but clear of the hold, at most
    `longest_col` (the column the longest settle ends with)."""
    rows, cols = held.shape
    if longest_col < 1:
        return np.full(rows, max(longest_col, 0), dtype=np.int_)
    window = ~held[:, 1:longest_col + 1]
    found = window.any(axis=1)
    return np.where(found, 1 + np.argmax(window, axis=1), longest_col).astype(np.int_)


__all__ = ["HELD_SHARE", "may_be_held", "settle_columns", "settle_end"]
