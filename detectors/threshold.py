"""ThresholdDetector: a static threshold with N-of-M confirmation ("P99.9 above 800 ms in 3 of
the last 5 points"), the simple rule to start from and to compare the tail detector with."""
from __future__ import annotations

from typing import Any, ClassVar, Literal, Mapping, Sequence

import numpy as np
from pydantic import Field, model_validator

from core.detection import Detection
from core.query import Series
from detectors import _robust
from detectors.base import DetectorParams, Offload


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


def threshold_breaches(
    params: ThresholdParams, timestamps: np.ndarray, values: np.ndarray, now: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Vectorized core over S series [S x P] on one grid.

    Returns:
        (fired (S,), breach (S, P), recent (S, P), count (S,), episode start column (S,) or -1).
    """
    p = params
    ts = np.asarray(timestamps, dtype=np.float64)
    x = np.array(values, dtype=np.float64, ndmin=2)
    in_window = (ts > now - p.window_seconds) & (ts <= now)
    x[:, ~in_window] = np.nan
    valid = np.isfinite(x)
    with np.errstate(invalid="ignore"):
        breach = valid & ((x > p.threshold) if p.direction == "above" else (x < p.threshold))
    recent = _robust.last_valid_mask(valid, p.confirm_window_points)
    count = np.sum(breach & recent, axis=1)
    latest = _robust.last_true_index(valid)
    fresh = (latest >= 0) & (
        np.where(latest >= 0, ts[np.maximum(latest, 0)] if ts.size else 0.0, -np.inf)
        >= now - p.max_staleness_seconds
    )
    fired = fresh & (count >= p.confirm_points)
    start = _robust.episode_start_index(breach, valid, p.confirm_window_points - p.confirm_points)
    return fired, breach, recent, count, np.where(fired, start, -1)


class ThresholdDetector:
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

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        """Nothing to prepare."""
        return None

    def detect(self, series: Series, now: float) -> Detection:
        """Decide on one series. Never raises for bad data: returns fired=False with a reason."""
        p = self.params
        arrays = _robust.series_arrays(series.timestamps, series.values)
        if isinstance(arrays, str):
            return Detection(detector=self.kind, fired=False, reason=arrays)
        ts, vs = arrays
        fired, breach, recent, count, start = threshold_breaches(p, ts, vs[None, :], now)
        in_window = (ts > now - p.window_seconds) & (ts <= now) & np.isfinite(vs)
        word = ">" if p.direction == "above" else "<"
        common: dict[str, Any] = {
            "detector": self.kind, "threshold": p.threshold,
            "details": {"confirm": f"{int(count[0])}/{p.confirm_window_points} "
                                   f"(need {p.confirm_points})"},
        }
        if not in_window.any():
            return Detection(fired=False, reason=f"no data in the last {p.window_seconds:g} s",
                             **common)
        last = int(np.flatnonzero(in_window)[-1])
        if ts[last] < now - p.max_staleness_seconds:
            return Detection(fired=False, value=float(vs[last]), **common,
                             reason=f"stale: newest point is {now - ts[last]:.0f} s old")
        if not fired[0]:
            return Detection(
                fired=False, value=float(vs[last]), **common,
                reason=f"{int(count[0])}/{p.confirm_window_points} recent points {word} "
                       f"{p.threshold:g} (need {p.confirm_points}); latest {vs[last]:.4g}",
            )
        hits = np.flatnonzero(breach[0])
        hits = hits[hits >= start[0]][-4 * p.confirm_window_points:]
        last_hit = int(np.flatnonzero(breach[0] & recent[0])[-1])
        return Detection(
            fired=True, value=float(vs[last_hit]), episode_start=float(ts[start[0]]),
            evidence=tuple((float(ts[i]), float(vs[i])) for i in hits), **common,
            reason=f"{int(count[0])}/{p.confirm_window_points} recent points {word} "
                   f"{p.threshold:g}; latest breach {vs[last_hit]:.4g}",
        )
