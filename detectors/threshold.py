"""ThresholdDetector: a static threshold with N-of-M confirmation ("P99.9 above 800 ms in 3 of
the last 5 points"), the simple rule to start from and to compare the tail detector with."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

import numpy as np
from numpy.typing import NDArray
from pydantic import Field, model_validator

from core.detection import Detection, DetectorStatus, RecoveryRule, Side, threshold_or_baseline
from detectors import _robust
from detectors.base import DetectorParams
from detectors.grid_detector import GridDetector

# The statuses a row can have (only OK rows can fire), bound as module names for the row checks.
OK, NO_DATA, STALE = DetectorStatus.OK, DetectorStatus.NO_DATA, DetectorStatus.STALE


class ThresholdParams(DetectorParams):
    """Parameters of `threshold`. `threshold` is in the series' own unit."""

    threshold: float
    """The static level, in the series' unit (e.g. 0.8 for seconds, 800000 for Triton's `_us`)."""
    direction: Literal["above", "below"] = "above"
    """`above` fires on values > threshold, `below` on values < threshold."""
    confirm_points: int = Field(3, ge=1)
    """N: breaching points needed among the last M valid points."""
    confirm_window_points: int = Field(5, ge=1)
    """M: N-of-M survives the one-scrape dips of Triton's summaries; N consecutive does not."""
    window_seconds: float = Field(300.0, gt=0)
    """History to query; the episode start is traced back within it."""
    max_staleness_seconds: float = Field(60.0, gt=0)
    """Newest point older than this: stale data, never read as healthy or as firing."""

    @model_validator(mode="after")
    def _n_not_above_m(self) -> "ThresholdParams":
        if self.confirm_points > self.confirm_window_points:
            raise ValueError("confirm_points must be <= confirm_window_points")
        return self

    @property
    def recovery_rule(self) -> RecoveryRule:
        """Firing above `threshold` it recovers below it; firing below, above."""
        return RecoveryRule(Side.BELOW if self.direction == "above" else Side.ABOVE, self.threshold)


@dataclass(frozen=True)
class ThresholdBatch:
    """Per-row arrays of one evaluation of S series on one grid of P timestamps."""

    timestamps: NDArray[np.float64]  # (P,)
    values: NDArray[np.float64]  # (S, P), NaN where missing or outside the window
    valid: NDArray[np.bool_]  # (S, P) finite points inside the window
    fired: NDArray[np.bool_]  # (S,)
    breach: NDArray[np.bool_]  # (S, P)
    recent: NDArray[np.bool_]  # (S, P) the last M valid points
    count: NDArray[np.int_]  # (S,) breaches among `recent`
    episode_start: NDArray[np.int_]  # (S,) column of the episode's first breach, -1 if none
    status: NDArray[np.int8]  # (S,) OK, NO_DATA (no point in the window) or STALE


def threshold_breaches(
    params: ThresholdParams, timestamps: NDArray[np.float64], values: NDArray[np.float64], now: float
) -> ThresholdBatch:
    """Vectorized core over S series [S x P] on one grid; NaN marks a missing point."""
    p = params
    ts = np.asarray(timestamps, dtype=np.float64)
    x = np.array(values, dtype=np.float64, ndmin=2)
    in_window = (ts > now - p.window_seconds) & (ts <= now)
    x[:, ~in_window] = np.nan
    valid = np.isfinite(x)
    with np.errstate(invalid="ignore"):
        breach = valid & ((x > p.threshold) if p.direction == "above" else (x < p.threshold))
    recent = _robust.last_valid_mask(valid, p.confirm_window_points)
    count: NDArray[np.int_] = np.sum(breach & recent, axis=1)
    latest = _robust.last_true_index(valid)
    latest_t = np.where(latest >= 0, ts[np.maximum(latest, 0)] if ts.size else 0.0, -np.inf)
    status = np.full(x.shape[0], OK, dtype=np.int8)
    status[latest_t < now - p.max_staleness_seconds] = STALE
    status[latest < 0] = NO_DATA
    fired = (status == OK) & (count >= p.confirm_points)
    start = _robust.episode_start_index(breach, valid, p.confirm_window_points - p.confirm_points)
    return ThresholdBatch(ts, x, valid, fired, breach, recent, count, np.where(fired, start, -1), status)


def batch_detection(batch: ThresholdBatch, row: int, params: ThresholdParams, kind: str,
                    now: float) -> Detection:
    """The Detection for one row of a ThresholdBatch, with a one-line reason either way."""
    p, b = params, batch
    ts, vs = b.timestamps, b.values[row]
    count = int(b.count[row])
    word = ">" if p.direction == "above" else "<"
    status = int(b.status[row])
    common: dict[str, Any] = {
        "detector": kind, "threshold": p.threshold, "status": DetectorStatus(status),
        "details": {"confirm": f"{count}/{p.confirm_window_points} (need {p.confirm_points})"},
    }
    if status == NO_DATA:
        return Detection(fired=False, reason=f"no data in the last {p.window_seconds:g} s", **common)
    last = int(np.flatnonzero(b.valid[row])[-1])
    if status == STALE:
        return Detection(fired=False, value=float(vs[last]), **common,
                         reason=f"stale: newest point is {now - ts[last]:.0f} s old")
    if not b.fired[row]:
        return Detection(
            fired=False, value=float(vs[last]), **common,
            reason=f"{count}/{p.confirm_window_points} recent points {word} "
                   f"{p.threshold:g} (need {p.confirm_points}); latest {vs[last]:.4g}",
        )
    start = int(b.episode_start[row])
    hits = np.flatnonzero(b.breach[row])
    hits = hits[hits >= start][-4 * p.confirm_window_points:]
    last_hit = int(np.flatnonzero(b.breach[row] & b.recent[row])[-1])
    return Detection(
        fired=True, value=float(vs[last_hit]), episode_start=float(ts[start]),
        evidence=tuple((float(ts[i]), float(vs[i])) for i in hits), **common,
        recovery_line=threshold_or_baseline(p.recovery_rule.good, p.threshold, None),
        reason=f"{count}/{p.confirm_window_points} recent points {word} "
               f"{p.threshold:g}; latest breach {vs[last_hit]:.4g}",
    )


class ThresholdDetector(GridDetector):
    """Static threshold, N of the last M points. Stateless and restart-safe like every detector."""

    kind: ClassVar[str] = "threshold"
    Params: ClassVar[type[DetectorParams]] = ThresholdParams

    def __init__(self, params: ThresholdParams | Mapping[str, Any]) -> None:
        self.params = (
            params if isinstance(params, ThresholdParams)
            else ThresholdParams.model_validate(params)
        )

    @property
    def lookback_seconds(self) -> float:
        return self.params.window_seconds

    def decide(self, grid: NDArray[np.float64], values: NDArray[np.float64], now: float) -> list[Detection]:
        """Every row at once (`threshold_breaches`), one Detection each."""
        batch = threshold_breaches(self.params, grid, values, now)
        return [batch_detection(batch, i, self.params, self.kind, now) for i in range(values.shape[0])]
