"""The value-series path of the sequential tail detector: a robust, winsorized CUSUM (Page's
test) on a series' values against a median/MAD baseline, decided for S series at once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from detectors import _robust
from detectors.base import DetectorParams

# Why a row was or was not decided; only OK rows can fire.
OK, NO_DATA, SHORT_HISTORY, STALE = range(4)
# Mean absolute deviation of normal noise is 0.798 sigma.
MEAN_DEV_TO_SIGMA = 0.7979
# Re-reads of the baseline before the excursion's start: each moves the start towards the fixed
# point where the start found equals the start the baseline was read before.
REFINE_PASSES = 3


class ValueCusumParams(DetectorParams):
    """Parameters of the value path. Sigmas are robust ones (1.4826 * MAD of the baseline)."""

    direction: Literal["up", "both"] = "up"
    """`up`: only increases are evidence (latency incidents are increases); `both`: a second,
    mirrored CUSUM also accumulates decreases."""
    min_absolute_increase: float = Field(0.0, ge=0)
    """Floor, in the series' unit, on how far a point must be from the baseline to count as
    evidence: the drift allowance is max(drift_sigmas * sigma, this). 0 leaves it to the sigmas;
    for latency set it (e.g. 0.05 for a `_seconds` series), so noise on a 3 ms model never adds up."""
    baseline_window_seconds: float = Field(1800.0, gt=0)
    """Trailing history, before the recent window, whose median/MAD are the baseline: 360 points
    at a 5 s scrape, 120 at 15 s; long enough that one busy spell is not the whole baseline."""
    recent_window_seconds: float = Field(600.0, gt=0)
    """Newest stretch, excluded from the baseline so an ongoing anomaly (up to 10 min old) does
    not pull it along."""
    drift_sigmas: float = Field(1.5, ge=0)
    """k: each point adds (z - k) to the statistic, so a shift smaller than k sigmas never adds up
    and the textbook optimum is for shifts of about 2k sigmas."""
    threshold_sigmas: float = Field(8.0, gt=0)
    """h: the decision line on the statistic; larger means fewer false alarms (arl0) and later
    detection."""
    max_step_sigmas: float = Field(4.0, gt=0)
    """The most one point adds to (or drains from) the statistic: one huge outlier (a single slow
    request, a byte burst) cannot fire alone; firing takes at least h / this points."""
    min_relative_change: float = Field(0.1, ge=0)
    """Floor on the drift allowance as a fraction of the baseline: on a quiet or quantized series
    (MAD 0) a +8% move is not an incident, however many sigmas it is."""
    mean_deviation_floor: bool = True
    """Also floor sigma with the baseline's mean absolute deviation / 0.798: on bursty or
    zero-inflated series (MAD 0, bursts normal) the bursts set the scale, not the quiet majority."""
    min_baseline_points: int = Field(10, ge=3)
    """Fewer valid points than this in the baseline: too little history. With less history than
    the windows want, the first points of the series stand in as the baseline (a new model)."""
    max_staleness_seconds: float = Field(60.0, gt=0)
    """Newest point older than this: stale data, never read as healthy or as firing."""

    @property
    def lookback_seconds(self) -> float:
        """History one decision reads: the baseline and the recent window."""
        return self.baseline_window_seconds + self.recent_window_seconds


@dataclass(frozen=True)
class ValueCusumBatch:
    """Per-row arrays of one evaluation of S series on one grid of P timestamps."""

    fired: NDArray[np.bool_]  # (S,)
    episode_start: NDArray[np.int_]  # (S,) column where the firing excursion began, -1 if none
    truncated: NDArray[np.bool_]  # (S,) that excursion began at or before the lookback's start
    statistic: NDArray[np.float64]  # (S,) CUSUM at the newest column (the larger side for both)
    threshold: NDArray[np.float64]  # (S,) decision line h
    baseline: NDArray[np.float64]  # (S,) median of the baseline points
    scale: NDArray[np.float64]  # (S,) robust sigma of the baseline, floored
    value: NDArray[np.float64]  # (S,) newest valid value, NaN if none
    latest: NDArray[np.int_]  # (S,) newest valid column, -1 if none
    direction: NDArray[np.int8]  # (S,) +1 up, -1 down: the side the statistic comes from
    status: NDArray[np.int8]  # (S,) OK, NO_DATA, SHORT_HISTORY or STALE


def _page_cusum(increments: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.int_]]:
    """Page's S_t = max(0, S_{t-1} + inc_t) for every column, in closed form, and per row the
    column after the last S == 0 (where the current excursion began; 0 if it never touched 0).

    S_t = C_t - min(0, min_{j<=t} C_j) with C the cumulative sum: no Python loop over columns.
    """
    c = np.cumsum(increments, axis=1)
    s = c - np.minimum(np.minimum.accumulate(c, axis=1), 0.0)
    last_zero = _robust.last_true_index(s <= 0.0)
    return s, last_zero + 1


def _baseline(
    params: ValueCusumParams, x: NDArray[np.float64], base: NDArray[np.bool_]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int_]]:
    """Per-row (median, floored robust sigma, count) of the points of x where `base` is true."""
    xb = np.where(base, x, np.nan)
    med, mad, nb = _robust.robust_baseline(xb)
    scale = _robust.robust_scale(med, mad)
    if params.mean_deviation_floor:
        with np.errstate(invalid="ignore"):
            dev_sum = np.nansum(np.abs(xb - med[:, None]), axis=1)
            scale = np.fmax(scale, dev_sum / np.maximum(nb, 1) / MEAN_DEV_TO_SIGMA)
    return med, scale, nb


def _statistic(
    params: ValueCusumParams, x: NDArray[np.float64], valid: NDArray[np.bool_],
    med: NDArray[np.float64], scale: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.int_], NDArray[np.int8]]:
    """Per-row (CUSUM at the newest column, column where its excursion began, side +1/-1)."""
    p = params
    allowance = np.maximum.reduce([
        p.drift_sigmas * scale, np.full_like(scale, p.min_absolute_increase),
        p.min_relative_change * np.abs(med),
    ]) / scale
    with np.errstate(invalid="ignore"):
        z = (x - med[:, None]) / scale[:, None]

    def increments(dev: NDArray[np.float64]) -> NDArray[np.float64]:
        # A gap (NaN) neither builds nor drains evidence.
        step = np.clip(dev - allowance[:, None], -p.max_step_sigmas, p.max_step_sigmas)
        return np.where(valid, step, 0.0)

    s_up, start = _page_cusum(increments(z))
    stat = s_up[:, -1]
    side = np.ones(x.shape[0], dtype=np.int8)
    if p.direction == "both":
        s_dn, start_dn = _page_cusum(increments(-z))
        down = s_dn[:, -1] > stat
        stat = np.where(down, s_dn[:, -1], stat)
        start = np.where(down, start_dn, start)
        side[down] = -1
    return stat, start, side


def evaluate_value_cusum(
    params: ValueCusumParams,
    grid: NDArray[np.float64],
    values: NDArray[np.float64],
    now: float,
) -> ValueCusumBatch:
    """Decide S series sharing one time grid. Pure; never raises for NaN or constant data.

    Args:
        params: detector parameters.
        grid: (P,) unix seconds, ascending (a range query's step grid).
        values: (S, P); NaN marks a missing point.
        now: evaluation time; points after it and before its lookback are ignored.

    Returns:
        A ValueCusumBatch; `fired[i]` is the decision for row i and `episode_start[i]` its
        dedup key, which stays put while the excursion lasts.
    """
    p = params
    ts = np.asarray(grid, dtype=np.float64)
    x = np.array(values, dtype=np.float64, ndmin=2)
    if ts.size == 0:  # an empty grid: every row is NO_DATA; avoids empty reductions below
        x = np.full((x.shape[0], 1), np.nan)
        ts = np.array([-np.inf])
    rows = np.arange(x.shape[0])
    t_recent = now - p.recent_window_seconds
    in_lookback = (ts > t_recent - p.baseline_window_seconds) & (ts <= now)
    x[:, ~in_lookback] = np.nan
    x[~np.isfinite(x)] = np.nan
    valid = ~np.isnan(x)
    latest = _robust.last_true_index(valid)
    first = np.argmax(valid, axis=1)

    # Short history: the first min_baseline_points valid points stand in for the baseline, so a
    # new series is decided after a few more points instead of staying blind for a whole window.
    rank = np.cumsum(valid, axis=1)
    base = valid & ((ts <= t_recent) | (rank <= p.min_baseline_points))
    med, scale, nb = _baseline(p, x, base)
    stat, start, side = _statistic(p, x, valid, med, scale)

    # Rows in an excursion re-read the baseline from the window that ends where the excursion
    # began: those points do not change from cycle to cycle, so the start found with them does not
    # creep while the trailing baseline slowly absorbs the episode (the start is the dedup key).
    for _ in range(REFINE_PASSES):
        t_start = ts[np.minimum(start, ts.size - 1)]
        pre = valid & (ts < t_start[:, None]) & (ts >= t_start[:, None] - p.baseline_window_seconds)
        again = (stat > 0) & (start > first) & (np.sum(pre, axis=1) >= p.min_baseline_points)
        if not again.any():
            break
        med[again], scale[again], nb[again] = _baseline(p, x[again], pre[again])
        stat[again], start[again], side[again] = _statistic(
            p, x[again], valid[again], med[again], scale[again])

    latest_t = np.where(latest >= 0, ts[np.maximum(latest, 0)], -np.inf)
    status = np.full(x.shape[0], OK, dtype=np.int8)
    # Later assignments win: ordered from least to most fundamental.
    status[nb < p.min_baseline_points] = SHORT_HISTORY
    status[latest_t < now - p.max_staleness_seconds] = STALE
    status[latest < 0] = NO_DATA
    over = stat > p.threshold_sigmas
    truncated = over & (start <= first)
    # An excursion that began before the lookback is old news the baseline failed to absorb (a
    # drift): its start would slide with the window, so it is reported, never fired anew.
    fired = (status == OK) & over & ~truncated
    return ValueCusumBatch(
        fired=fired,
        episode_start=np.where(fired, start, -1),
        truncated=truncated,
        statistic=stat,
        threshold=np.full(x.shape[0], p.threshold_sigmas),
        baseline=med,
        scale=scale,
        value=np.where(latest >= 0, x[rows, np.maximum(latest, 0)], np.nan),
        latest=latest,
        direction=side,
        status=status,
    )
