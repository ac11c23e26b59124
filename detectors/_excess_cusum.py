"""The sequential test behind `tail_excess`: a CUSUM on latency mass above what the bulk explains.

"P99.9 > L" is the statement "more than 0.1% of requests took longer than L". Each step brings
`n` requests and their summed latency; whatever exceeds `n x allowance` (the bulk's per-request
latency with slack) is excess mass, and excess mass / (L - bulk) is how many requests above L it
is worth ("slow equivalents", k). Under H0 slow requests arrive at rate p0 = 1 - quantile, under
H1 at rho x p0; the Poisson log-likelihood ratio of a step is k ln(rho) - n p0 (rho - 1), and
Page's CUSUM S = max(0, S + llr) alarms at S >= h: the quickest detector for a given false-alarm
rate (Lorden). A single slow request adds ln(rho) x (its latency / L) and then drains at
p0 (rho - 1) per request, so rare slow requests never add up while a real tail does, fast.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from detectors._counter_steps import Steps


@dataclass(frozen=True)
class CusumTerms:
    """What the test is tuned to: H0/H1 rates, the decision line, and how the bulk is tracked."""

    line: float
    p0: float
    rate_ratio: float
    decision: float
    bulk_window_cols: int
    bulk_slack: float

    @property
    def jump(self) -> float:
        """Log-likelihood added per slow equivalent."""
        return math.log(self.rate_ratio)

    @property
    def drain(self) -> float:
        """Log-likelihood removed per request."""
        return self.p0 * (self.rate_ratio - 1.0)


@dataclass(frozen=True)
class CusumRun:
    """Per-column arrays [S x P] and per-row summaries [S] of one run of the test."""

    statistic: NDArray[np.float64]  # CUSUM after each column (carried over columns with no step)
    units: NDArray[np.float64]  # slow equivalents of each step, NaN where the step was not scored
    allowance: NDArray[np.float64]  # per-request latency the bulk explains at each step
    scored: NDArray[np.bool_]  # steps that entered the test
    episode_start: NDArray[np.int_]  # (S,) column where the current positive run began, -1 if none
    episode_units: NDArray[np.float64]  # (S,) slow equivalents since episode_start
    episode_requests: NDArray[np.float64]  # (S,) requests since episode_start


def trailing_min(x: NDArray[np.float64], window: int) -> NDArray[np.float64]:
    """Min of the `window` columns before each column (the column itself excluded), NaN-skipping;
    NaN where none of them has a value.

    A sliding minimum by doubling: minima of 2, 4, 8 ... adjacent columns, then two overlapping
    spans cover the window (a minimum does not mind counting a column twice): about log2(window)
    passes over the array instead of one per column of the window, and no [S x P x window]
    temporary. The window is padded with infinity on the left, so the first columns take the
    minimum of what they have."""
    rows, cols = x.shape
    width = min(window, cols)
    if width < 1:
        return np.full((rows, cols), np.nan)
    padded = np.full((rows, width + cols), np.inf)
    padded[:, width:] = np.where(np.isnan(x), np.inf, x)
    span, spans = 1, padded  # spans[:, k]: the min of padded[:, k : k + span]
    while 2 * span <= width:
        spans = np.minimum(spans[:, :-span], spans[:, span:])
        span *= 2
    # Column j's window is padded[:, j : j + width]: the spans starting at j and at j + width - span.
    out = np.minimum(spans[:, :cols], spans[:, width - span:width - span + cols])
    return np.where(np.isinf(out), np.nan, out)


def run_cusum(steps: Steps, terms: CusumTerms) -> CusumRun:
    """Run the test over every row. Pure: the same counters give the same verdict, so the state
    is recomputed from the queried range every cycle and survives restarts and failovers."""
    d_lat, d_req = steps.latency, steps.requests
    with np.errstate(divide="ignore", invalid="ignore"):
        per_request = np.where(d_req > 0, d_lat / d_req, np.nan)
    # The bulk is the lowest per-request mean of the recent steps: rare slow requests lift single
    # steps, so the minimum stays clean while it follows a genuine bulk shift within the window.
    bulk = trailing_min(per_request, terms.bulk_window_cols)
    allowance = bulk * (1.0 + terms.bulk_slack)
    scale = np.maximum(terms.line - bulk, 0.1 * terms.line)
    scored = np.isfinite(d_lat) & (d_req > 0) & np.isfinite(bulk)
    with np.errstate(invalid="ignore"):
        units = np.where(scored, np.maximum(d_lat - d_req * allowance, 0.0) / scale, np.nan)
    llr = np.where(scored, units * terms.jump - d_req * terms.drain, 0.0)

    stat = page_statistic(llr)
    start = run_starts(stat)
    ep_units = sum_since(np.nan_to_num(units), start)
    ep_req = sum_since(np.where(scored, d_req, 0.0), start)
    return CusumRun(stat, units, allowance, scored, start, ep_units, ep_req)


def page_statistic(llr: NDArray[np.float64]) -> NDArray[np.float64]:
    """Page's CUSUM of every row, S_j = max(0, S_(j-1) + llr_j) from S = 0, [S x P]. The recursion
    is sequential in columns, so it runs over the columns of a transposed copy: each step reads
    and writes contiguous memory, in place, where a column of [S x P] is strided and allocates."""
    by_col = np.ascontiguousarray(llr.T)
    stat = np.empty_like(by_col)
    prev = np.zeros(by_col.shape[1])
    for j in range(by_col.shape[0]):
        np.add(prev, by_col[j], out=stat[j])
        np.maximum(stat[j], 0.0, out=stat[j])
        prev = stat[j]
    return np.ascontiguousarray(stat.T)


def run_starts(stat: NDArray[np.float64]) -> NDArray[np.int_]:
    """Per row, the column where the current positive run of the statistic began (it rose from 0
    there), -1 where the statistic ends at 0. Read off the finished statistic, not tracked per step."""
    rows, cols = stat.shape
    if cols == 0:
        return np.full(rows, -1, dtype=np.int_)
    positive = stat > 0
    opened = positive.copy()
    opened[:, 1:] &= ~positive[:, :-1]
    last_opened = cols - 1 - np.argmax(opened[:, ::-1], axis=1)
    return np.where(positive[:, -1], last_opened, -1).astype(np.int_)


def sum_since(x: NDArray[np.float64], start: NDArray[np.int_]) -> NDArray[np.float64]:
    """Per row, the sum of `x` from column `start` to the last (0 where start is -1), added in
    column order: bit for bit the running sum the test used to keep per step. Over the columns of
    a transposed copy, as `page_statistic`: a cumulative sum along rows is several times slower.
    Only the rows in an episode are summed (a few percent of them in a healthy fleet)."""
    rows, cols = x.shape
    sums = np.zeros(rows)
    live = np.flatnonzero(start >= 0)
    if live.size:
        sums[live] = _sum_from(x[live], start[live])
    return sums


def _sum_from(x: NDArray[np.float64], start: NDArray[np.int_]) -> NDArray[np.float64]:
    """Per row, 0.0 plus each of `x` from column `start` (>= 0) on, in column order."""
    inside = np.arange(x.shape[1]) >= start[:, None]
    by_col = np.ascontiguousarray(np.where(inside, x, 0.0).T)
    sums = np.zeros(x.shape[0])
    for column in by_col:
        np.add(sums, column, out=sums)
    return sums
