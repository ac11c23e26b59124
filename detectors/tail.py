"""TailAnomalyDetector: a robust (median/MAD) jump detector for tail-latency series such as
P99.9, with N-of-M confirmation and an optional P99 companion to flag tail divergence."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray
from pydantic import Field, model_validator

from core.detection import Detection, RecoveryRule, Side, threshold_or_baseline
from core.query import Series
from detectors import _robust
from detectors._grid import align
from detectors.base import DetectorParams, DetectorStatus, Offload, detect_each

# The statuses a row can have (OK rows are decided by the confirmation count), bound as module
# names: a row's checks read these, and an enum member looked up on its class costs 5x as much.
OK, NO_DATA, NO_RECENT, STALE, SHORT_HISTORY, CONSTANT, COMPANION_MISSING = (
    DetectorStatus.OK, DetectorStatus.NO_DATA, DetectorStatus.NO_RECENT, DetectorStatus.STALE,
    DetectorStatus.SHORT_HISTORY, DetectorStatus.CONSTANT, DetectorStatus.COMPANION_MISSING)


class TailAnomalyParams(DetectorParams):
    """Parameters of `tail_anomaly`. Values are in the series' own unit (seconds, us ...)."""

    min_absolute_increase: float = Field(ge=0)
    """Value must exceed the baseline by at least this much, in the series' unit. No default:
    a floor that carries a unit cannot have one (50 ms is 0.05 for a `_seconds` histogram and
    50000 for Triton's `_us` summary)."""
    baseline_window_seconds: float = Field(900.0, gt=0)
    """Trailing window, before the evaluation window, whose median/MAD are the baseline."""
    evaluation_window_seconds: float = Field(300.0, gt=0)
    """Most recent window, excluded from the baseline so an ongoing anomaly cannot pollute it."""
    min_score: float = Field(5.0, gt=0)
    """Robust score (value - median) / (1.4826 * MAD) a point must exceed."""
    min_relative_increase: float = Field(0.5, ge=0)
    """Value must also be >= baseline * (1 + this): P99 going 85 -> 92 ms (+8%) is not a tail jump."""
    confirm_points: int = Field(3, ge=1)
    """N: exceedances needed among the last M valid points."""
    confirm_window_points: int = Field(5, ge=1)
    """M: Triton's summary dips back for a scrape while slow requests are still in its window,
    so N-of-M rather than N consecutive (docs/stack-facts.md)."""
    min_baseline_points: int = Field(30, ge=3)
    """Fewer valid baseline points than this: too little history to decide."""
    max_staleness_seconds: float = Field(60.0, gt=0)
    """Newest point older than this: stale data, never read as healthy or as firing."""
    companion_max_relative_increase: float = Field(0.25, ge=0)
    """With a companion (P99) series: it counts as flat while its recent median stays within
    baseline * (1 + this)."""
    require_divergence: bool = False
    """Fire only when the companion stays flat. Off by default: a burst of slow inputs can fill
    every instance and lift P99 too (docs/stack-facts.md), and that is still an incident."""

    @model_validator(mode="after")
    def _n_not_above_m(self) -> "TailAnomalyParams":
        if self.confirm_points > self.confirm_window_points:
            raise ValueError("confirm_points must be <= confirm_window_points")
        return self

    @property
    def recovery_rule(self) -> RecoveryRule:
        """It fires on jumps up: its query recovers below the line drawn at the episode's start."""
        return RecoveryRule(Side.BELOW)


@dataclass(frozen=True)
class TailBatch:
    """Per-row arrays of one evaluation of S series on one grid of P timestamps."""

    timestamps: NDArray[np.float64]  # (P,)
    lookback_cols: NDArray[np.bool_]  # (P,) columns inside the lookback window
    values: NDArray[np.float64]  # (S, P), NaN where missing or outside the lookback
    status: NDArray[np.int8]  # (S,) one of OK, NO_DATA ...
    fired: NDArray[np.bool_]  # (S,)
    baseline: NDArray[np.float64]  # (S,) median of the baseline window
    mad: NDArray[np.float64]  # (S,)
    baseline_points: NDArray[np.int_]  # (S,) valid points in the baseline window
    threshold: NDArray[np.float64]  # (S,) smallest value that counts as an exceedance
    score: NDArray[np.float64]  # (S, P) robust score of every point
    exceed: NDArray[np.bool_]  # (S, P)
    recent: NDArray[np.bool_]  # (S, P) the last M valid points of the evaluation window
    confirm_count: NDArray[np.int_]  # (S,) exceedances among `recent`
    episode_start: NDArray[np.int_]  # (S,) column of the episode's first exceedance, -1 if none
    latest: NDArray[np.int_]  # (S,) column of the newest valid point, -1 if none
    companion_baseline: NDArray[np.float64] | None = None  # (S,)
    companion_recent: NDArray[np.float64] | None = None  # (S,)
    diverging: NDArray[np.bool_] | None = None  # (S,) main series exceeds while companion is flat


def evaluate_tail_batch(
    params: TailAnomalyParams,
    timestamps: NDArray[np.float64],
    values: NDArray[np.float64],
    now: float,
    companion: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None,
) -> TailBatch:
    """Evaluate S series sharing one time grid, as arrays. Pure; never raises for NaN data.

    Args:
        params: detector parameters.
        timestamps: (P,) unix seconds, ascending (a Prometheus range query's step grid).
        values: (S, P); NaN marks a missing point.
        now: evaluation time; points after it are ignored (no look-ahead).
        companion: optional (timestamps (Q,), values (S, Q)) of each row's P99 series.

    Returns:
        A TailBatch; `fired[i]` is the decision for row i.
    """
    p = params
    ts = np.asarray(timestamps, dtype=np.float64)
    x = np.array(values, dtype=np.float64, ndmin=2)
    t_eval = now - p.evaluation_window_seconds
    in_lookback = (ts > t_eval - p.baseline_window_seconds) & (ts <= now)
    base_cols = in_lookback & (ts <= t_eval)
    eval_cols = in_lookback & (ts > t_eval)
    x[:, ~in_lookback] = np.nan
    x[~np.isfinite(x)] = np.nan
    valid = ~np.isnan(x)

    med, mad, nb = _robust.robust_baseline(x[:, base_cols])
    scale = _robust.robust_scale(med, mad)
    # One threshold that is the tightest of the three conditions: score, relative, absolute.
    threshold = np.maximum.reduce([
        med + p.min_score * scale,
        med + np.abs(med) * p.min_relative_increase,
        med + p.min_absolute_increase,
    ])
    with np.errstate(invalid="ignore"):
        score = (x - med[:, None]) / scale[:, None]
        exceed = valid & (x > threshold[:, None])

    recent = _robust.last_valid_mask(valid & eval_cols, p.confirm_window_points)
    count = np.sum(exceed & recent, axis=1)
    latest = _robust.last_true_index(valid)
    start = _robust.episode_start_index(
        exceed, valid, p.confirm_window_points - p.confirm_points
    )

    with np.errstate(invalid="ignore"):
        lo = np.where(valid, x, np.inf).min(axis=1, initial=np.inf)
        hi = np.where(valid, x, -np.inf).max(axis=1, initial=-np.inf)
    latest_t = np.where(latest >= 0, ts[np.maximum(latest, 0)] if ts.size else 0.0, -np.inf)
    status = np.full(x.shape[0], OK, dtype=np.int8)
    # Later assignments win, so they are ordered from least to most fundamental.
    status[lo == hi] = CONSTANT
    status[nb < p.min_baseline_points] = SHORT_HISTORY
    status[latest_t < now - p.max_staleness_seconds] = STALE
    status[~np.any(valid & eval_cols, axis=1)] = NO_RECENT
    status[~np.any(valid, axis=1)] = NO_DATA
    fired = (status == OK) & (count >= p.confirm_points)

    c_base = c_recent = diverging = None
    if companion is not None:
        c_ts, c_vals = companion
        c_x = np.array(c_vals, dtype=np.float64, ndmin=2)
        c_x[~np.isfinite(c_x)] = np.nan
        c_base, c_recent = _robust.companion_levels(
            np.asarray(c_ts, dtype=np.float64), c_x, now,
            p.baseline_window_seconds, p.evaluation_window_seconds, p.confirm_window_points,
        )
        with np.errstate(invalid="ignore"):
            flat = c_recent <= c_base + np.abs(c_base) * p.companion_max_relative_increase
        diverging = fired & flat
        if p.require_divergence:
            status[(status == OK) & np.isnan(c_base * c_recent)] = COMPANION_MISSING
            fired = diverging & (status == OK)
    elif p.require_divergence:
        status[status == OK] = COMPANION_MISSING
        fired = np.zeros_like(fired)

    return TailBatch(
        timestamps=ts, lookback_cols=in_lookback, values=x, status=status, fired=fired, baseline=med, mad=mad,
        baseline_points=nb, threshold=threshold, score=score, exceed=exceed, recent=recent,
        confirm_count=count, episode_start=np.where(fired, start, -1), latest=latest,
        companion_baseline=c_base, companion_recent=c_recent, diverging=diverging,
    )


def _fmt(v: float | None) -> str:
    return "nan" if v is None or not np.isfinite(v) else f"{v:.4g}"


def batch_detection(batch: TailBatch, row: int, params: TailAnomalyParams, kind: str) -> Detection:
    """The Detection for one row of a TailBatch, with a one-line reason either way."""
    b, p = batch, params
    ts, x = b.timestamps, b.values[row]
    status = int(b.status[row])
    n, m = p.confirm_points, p.confirm_window_points
    count = int(b.confirm_count[row])
    base, thr = float(b.baseline[row]), float(b.threshold[row])
    latest = int(b.latest[row])
    details: dict[str, Any] = {
        "confirm": f"{count}/{m} (need {n})",
        "baseline_mad": float(b.mad[row]),
        "baseline_points": int(b.baseline_points[row]),
        "missing_points": int(np.sum(np.isnan(x[b.lookback_cols]))),
    }
    # evaluate_tail_batch sets the three companion arrays together, or none of them.
    if b.companion_baseline is not None and b.companion_recent is not None and b.diverging is not None:
        details["companion_baseline"] = float(b.companion_baseline[row])
        details["companion_recent"] = float(b.companion_recent[row])
        details["diverging"] = bool(b.diverging[row])

    def make(fired: bool, reason: str, col: int = -1, **kw: Any) -> Detection:
        value = float(x[col]) if col >= 0 else None
        score = float(b.score[row, col]) if col >= 0 and np.isfinite(b.score[row, col]) else None
        return Detection(
            detector=kind, fired=fired, reason=reason, value=value,
            baseline=base if np.isfinite(base) else None,
            threshold=thr if np.isfinite(thr) else None, score=score, details=details,
            status=DetectorStatus(status), **kw,
        )

    if status == NO_DATA:
        return make(False, "no data: no finite points in the lookback window")
    if status == NO_RECENT:
        return make(False, f"no recent data: no points in the last {p.evaluation_window_seconds:g} s",
                    latest)
    if status == STALE:
        return make(False, f"stale: newest point at {ts[latest]:.0f} is older than "
                           f"{p.max_staleness_seconds:g} s", latest)
    if status == SHORT_HISTORY:
        return make(False, f"too little history: {int(b.baseline_points[row])} baseline points "
                           f"< {p.min_baseline_points}", latest)
    if status == CONSTANT:
        return make(False, f"constant series at {_fmt(x[latest])}: nothing to compare", latest)
    if status == COMPANION_MISSING:
        return make(False, "divergence required but the companion series has no data", latest)

    if not b.fired[row]:
        why = f"{count}/{m} recent points above {_fmt(thr)} (need {n})"
        if count >= n and p.require_divergence:
            why = (f"{why}, but companion rose to {_fmt(details.get('companion_recent'))} "
                   f"from {_fmt(details.get('companion_baseline'))}: no divergence")
        return make(False, f"{why}; latest {_fmt(x[latest])}, baseline {_fmt(base)}", latest)

    exc_recent = np.flatnonzero(b.exceed[row] & b.recent[row])
    last_exc = int(exc_recent[-1])
    start = int(b.episode_start[row])
    # A chain that reaches the lookback's first point may have begun earlier: its start then
    # slides with the window, so the caller should not rely on it as a stable dedup key.
    details["episode_truncated"] = start == int(np.argmax(b.lookback_cols & ~np.isnan(x)))
    episode = np.flatnonzero(b.exceed[row])
    episode = episode[episode >= start][-4 * m:]  # bounded: the journal wants evidence, not history
    evidence = tuple((float(ts[i]), float(x[i])) for i in episode)
    reason = (f"{count}/{m} recent points above {_fmt(thr)} (baseline {_fmt(base)}, "
              f"score {_fmt(b.score[row, last_exc])}), latest exceedance {_fmt(x[last_exc])}")
    if b.diverging is not None:
        reason += "; tail diverges: companion flat" if b.diverging[row] else "; companion rose too"
    # The threshold drawn from the baseline before the episode (the baseline when it has none).
    line = threshold_or_baseline(p.recovery_rule.good, thr if np.isfinite(thr) else None,
                                 base if np.isfinite(base) else None)
    return make(True, reason, last_exc, episode_start=float(ts[start]), evidence=evidence, recovery_line=line)


class TailAnomalyDetector:
    """Robust jump detector for tail latency. Stateless: every cycle recomputes from the range
    query, so a restart loses nothing and the same episode keeps the same `episode_start`."""

    kind: ClassVar[str] = "tail_anomaly"
    Params: ClassVar[type[DetectorParams]] = TailAnomalyParams

    def __init__(self, params: TailAnomalyParams | Mapping[str, Any]) -> None:
        self.params = (
            params if isinstance(params, TailAnomalyParams)
            else TailAnomalyParams.model_validate(params)
        )

    @property
    def lookback_seconds(self) -> float:
        return self.params.baseline_window_seconds + self.params.evaluation_window_seconds

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload,
                      companions: Sequence[Series | None] | None = None) -> None:
        """Nothing to prepare: the baseline comes from the range query itself."""
        return None

    def detect(self, series: Series, now: float, companion: Series | None = None) -> Detection:
        """Decide on a P99.9 series, optionally with the same model's P99 as `companion`.
        Never raises for bad data.

        With a companion, `details["diverging"]` says whether P99 stayed flat while P99.9 rose,
        and `require_divergence` makes that a condition for firing.
        """
        arrays = _robust.series_arrays(series.timestamps, series.values)
        if isinstance(arrays, str):
            return Detection(detector=self.kind, fired=False, reason=arrays, status=DetectorStatus.NO_DATA)
        comp = None
        if companion is not None:
            c_arrays = _robust.series_arrays(companion.timestamps, companion.values)
            # A malformed companion is treated as an empty one: the main verdict still stands.
            comp = (np.empty(0), np.empty((1, 0))) if isinstance(c_arrays, str) else (
                c_arrays[0], c_arrays[1][None, :])
        ts, vs = arrays
        batch = evaluate_tail_batch(self.params, ts, vs[None, :], now, comp)
        return batch_detection(batch, 0, self.params, self.kind)

    def detect_many(
        self, series: Sequence[Series], now: float, companions: Sequence[Series | None] | None = None
    ) -> list[Detection]:
        """The vectorized path: aligns the series (and their companions, each on their own grid)
        and decides every row at once. Raises on a malformed series (see `align`)."""
        paired: list[Series] | None = None
        if companions is not None:
            paired = [c for c in companions if c is not None]
            if len(paired) != len(series):
                # A series without its companion cannot join the companion batch (as an all-NaN
                # row it would read "companion rose too"); such cycles are rare: one by one.
                return detect_each(self.detect, series, now, companions)
        if not series:
            return []
        grid, values = align(series)
        return self.detect_arrays(grid, values, now, align(paired) if paired is not None else None)

    def evaluate_many(
        self,
        timestamps: NDArray[np.float64],
        values: NDArray[np.float64],
        now: float,
        companion: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None,
    ) -> TailBatch:
        """The vectorized path as arrays: S series [S x P] on one grid. See evaluate_tail_batch."""
        return evaluate_tail_batch(self.params, timestamps, values, now, companion)

    def detect_arrays(
        self,
        timestamps: NDArray[np.float64],
        values: NDArray[np.float64],
        now: float,
        companion: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None,
    ) -> list[Detection]:
        """One Detection per row of `values` [S x P] on the shared grid `timestamps`."""
        batch = evaluate_tail_batch(self.params, timestamps, values, now, companion)
        return [batch_detection(batch, i, self.params, self.kind) for i in range(batch.fired.size)]
