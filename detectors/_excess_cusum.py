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
    NaN where none of them has a value. Shifted minima: no [S x P x window] temporary."""
    rows, cols = x.shape
    filled = np.where(np.isnan(x), np.inf, x)
    out = np.full((rows, cols), np.inf)
    for lag in range(1, min(window, cols) + 1):
        np.minimum(out[:, lag:], filled[:, :-lag], out=out[:, lag:])
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

    rows, cols = d_lat.shape
    stat = np.zeros((rows, cols))
    s = np.zeros(rows)
    start = np.full(rows, -1, dtype=np.int_)
    ep_units = np.zeros(rows)
    ep_req = np.zeros(rows)
    for j in range(cols):
        new = np.maximum(s + llr[:, j], 0.0)
        opened = (new > 0) & (s == 0)
        start = np.where(opened, j, np.where(new > 0, start, -1))
        u = np.nan_to_num(units[:, j])
        r = np.where(scored[:, j], d_req[:, j], 0.0)
        ep_units = np.where(new > 0, np.where(opened, u, ep_units + u), 0.0)
        ep_req = np.where(new > 0, np.where(opened, r, ep_req + r), 0.0)
        s = new
        stat[:, j] = s
    return CusumRun(stat, units, allowance, scored, start, ep_units, ep_req)
