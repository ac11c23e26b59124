"""ValueCusumDetector (`value_cusum`): a robust, winsorized CUSUM (Page's test) on one series'
values (a recorded P99.9, a histogram quantile, any level) against a median/MAD baseline, decided
for S series at once. The sequential test of `tail_excess` for series that are not counters; the
detector NAB scores (docs/detectors.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from core.detection import Detection, DetectorStatus, RecoveryLine, RecoveryRule, Side
from detectors import _robust
from detectors.base import DetectorParams
from detectors.grid_detector import GridDetector
from detectors.sequential.bank import page

# The statuses a row can have (only OK rows can fire), bound as module names for the row checks.
OK, NO_DATA, SHORT_HISTORY, STALE = (DetectorStatus.OK, DetectorStatus.NO_DATA, DetectorStatus.SHORT_HISTORY,
                                     DetectorStatus.STALE)
# Mean absolute deviation of normal noise is 0.798 sigma.
MEAN_DEV_TO_SIGMA = 0.7979
# Re-reads of the baseline before the excursion's start: each moves the start towards the fixed
# point where the start found equals the start the baseline was read before.
REFINE_PASSES = 3


class ValueCusumParams(DetectorParams):
    """Parameters of `value_cusum`. Sigmas are robust ones (1.4826 * MAD of the baseline)."""

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

    @property
    def recovery_rule(self) -> RecoveryRule:
        """An upward episode recovers below its line (with `both`, a downward one draws its line
        above: each detection says its side)."""
        return RecoveryRule(Side.BELOW)

    def false_alarm_steps(self) -> float:
        """The rate the value path runs at, in steps (it has no traffic): the mean run length
        between false alarms of a CUSUM on unit-variance Gaussian scores with this drift allowance
        and threshold (Siegmund's approximation, b = h + 1.166). Heavier tails alarm sooner: on NAB
        the measured rate is in docs/detectors.md."""
        k, b = self.drift_sigmas, self.threshold_sigmas + 1.166
        if k <= 0:
            return b * b  # no drift: the run length of a driftless walk to b
        return (math.exp(min(2 * k * b, 700.0)) - 2 * k * b - 1) / (2 * k * k)

    def allowance(self, baseline: float, scale: float) -> float:
        """The drift allowance in the series' unit: how far from `baseline` a point must be to add
        evidence (as `_statistic` computes it, there in sigmas)."""
        return max(self.drift_sigmas * scale, self.min_absolute_increase, self.min_relative_change * abs(baseline))


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

    s_up, start = page(increments(z))
    stat = s_up[:, -1]
    side = np.ones(x.shape[0], dtype=np.int8)
    if p.direction == "both":
        s_dn, start_dn = page(increments(-z))
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


def _fmt(v: float) -> str:
    return f"{v:.4g}" if np.isfinite(v) else "nan"


def value_detection(b: ValueCusumBatch, row: int, grid: NDArray[np.float64], p: ValueCusumParams,
                    kind: str) -> Detection:
    """The Detection for one row, with a one-line reason either way."""
    status, latest, start = int(b.status[row]), int(b.latest[row]), int(b.episode_start[row])
    stat, h = float(b.statistic[row]), float(b.threshold[row])
    base, value, scale = float(b.baseline[row]), float(b.value[row]), float(b.scale[row])
    side = int(b.direction[row])
    details: dict[str, Any] = {"scale": scale, "truncated": bool(b.truncated[row]), "direction": side,
                               "assumed": {"false_alarm_steps_gaussian": p.false_alarm_steps()}}

    def make(fired: bool, reason: str, **kw: Any) -> Detection:
        return Detection(detector=kind, fired=fired, reason=reason,
                         value=value if np.isfinite(value) else None,
                         baseline=base if np.isfinite(base) else None, threshold=h,
                         score=stat / h if h > 0 else None, details=details, status=DetectorStatus(status), **kw)

    if status == NO_DATA:
        return make(False, "no data: no finite points in the lookback window")
    if status == STALE:
        return make(False, f"stale: newest point at {grid[latest]:.0f} is older than "
                           f"{p.max_staleness_seconds:g} s")
    if status == SHORT_HISTORY:
        return make(False, f"too little history: fewer than {p.min_baseline_points} baseline points")
    what = f"CUSUM {stat:.2f} (line {h:.2f}), latest {_fmt(value)}, baseline {_fmt(base)}"
    if not b.fired[row]:
        if b.truncated[row]:
            return make(False, f"{what}: the excursion reaches back past the lookback, its start is "
                               "unknown (not acted on again; not a recovery either)")
        return make(False, what)
    # `h` is in sigmas of the statistic; the line the series itself recovers across is where a point
    # stops adding evidence: the baseline (read before the excursion) plus the drift allowance.
    allowance = p.allowance(base, scale)
    line = (RecoveryLine(base + allowance, Side.BELOW, "baseline + allowance") if side > 0
            else RecoveryLine(base - allowance, Side.ABOVE, "baseline - allowance"))
    return make(True, what, episode_start=float(grid[start]), evidence=((float(grid[latest]), value),),
                recovery_line=line)


class ValueCusumDetector(GridDetector):
    """Sequential detector on one value series per target. Stateless: each cycle recomputes the test
    from the queried range, so restarts and failovers lose nothing and one episode keeps one start."""

    kind: ClassVar[str] = "value_cusum"
    Params: ClassVar[type[DetectorParams]] = ValueCusumParams

    def __init__(self, params: ValueCusumParams | Mapping[str, Any]) -> None:
        self.params = (params if isinstance(params, ValueCusumParams)
                       else ValueCusumParams.model_validate(params))

    @property
    def lookback_seconds(self) -> float:
        return self.params.lookback_seconds

    def decide(self, grid: NDArray[np.float64], values: NDArray[np.float64], now: float) -> list[Detection]:
        """Every row at once (`evaluate_value_cusum`), one Detection each."""
        batch = evaluate_value_cusum(self.params, grid, values, now)
        return [value_detection(batch, i, grid, self.params, self.kind) for i in range(values.shape[0])]
