"""`ForecastBreachDetector`: asks its forecaster for curves and fires while the series is still on
the safe side but a curve crosses the threshold within the horizon."""
from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from core.detection import Detection
from core.query import Series, series_key
from detectors.base import DetectorParams, Offload, detect_each
from detectors.forecast.arrays import read_history
from detectors.forecast.breach import Episodes, first_crossing
from detectors.forecast.holt import HoltForecaster
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.prophet import ProphetForecaster
from detectors.forecast.protocol import Forecaster

KIND = "forecast_breach"
_DETAIL_POINTS = 20  # forecast points kept in Detection.details (the journal, not the math)
_EVIDENCE_POINTS = 10


def _downsample_rows(*cols: NDArray[np.float64], points: int = _DETAIL_POINTS) -> list[list[float]]:
    n = cols[0].size
    if not n:
        return []
    idx = np.unique(np.linspace(0, n - 1, min(points, n)).round().astype(int))
    return [[round(float(c[i]), 6) for c in cols] for i in idx]


class ForecastBreachDetector:
    """Fires while the series is still on the safe side but its forecast crosses the threshold
    within ``horizon_seconds``. A breach already under way is left to the tail detector: this
    one's value is the lead time, and the episode stays open so re-crossing is not a new one.

    Holt (damped trend) refits every cycle; Prophet refits off the loop on a staggered schedule and
    `detect` only compares its cached forecast with the threshold.
    """

    kind: ClassVar[str] = KIND
    Params: ClassVar[type[DetectorParams]] = ForecastBreachParams

    def __init__(self, params: ForecastBreachParams | Mapping[str, Any]) -> None:
        self.params: ForecastBreachParams = (
            params if isinstance(params, ForecastBreachParams)
            else ForecastBreachParams.model_validate(params)
        )
        self._forecaster: Forecaster = (
            HoltForecaster(self.params) if self.params.model == "holt" else ProphetForecaster(self.params)
        )
        self._episodes = Episodes(self.params.horizon_seconds)

    @property
    def lookback_seconds(self) -> float:
        return self.params.lookback_seconds

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        """The only place heavy work starts, always through offload: Holt batch-fits equally long
        series, Prophet refits the series whose slot is due."""
        await self._forecaster.prepare(batch, now, offload)

    def detect(self, series: Series, now: float, companion: Series | None = None) -> Detection:
        """Decide on one series (a companion plays no part). Never raises for bad data: returns
        fired=False with a reason."""
        try:
            return self._detect(series, now)
        except Exception as exc:  # odd data or a bug here must not stop the poller
            return self._quiet(f"forecast failed: {type(exc).__name__}: {exc}")

    def detect_many(
        self, series: Sequence[Series], now: float, companions: Sequence[Series | None] | None = None
    ) -> list[Detection]:
        """One `detect` per series: the fits that batch well already did in `prepare`."""
        return detect_each(self.detect, series, now, companions)

    def _quiet(self, reason: str, value: float | None = None, **details: Any) -> Detection:
        return Detection(detector=KIND, fired=False, reason=reason, value=value,
                         threshold=self.params.threshold, details=details)

    def _beyond(self, v: float) -> bool:
        p = self.params
        return v >= p.threshold if p.direction == "above" else v <= p.threshold

    def _detect(self, series: Series, now: float) -> Detection:
        p = self.params
        key = series_key(series.labels)
        history = read_history(series, now, p)
        ts, vs = history.timestamps, history.values
        if ts.size < p.min_history_points:
            self._episodes.close(key, now)
            return self._quiet(f"too little history: {ts.size} usable points in the lookback, "
                               f"need {p.min_history_points}")
        current = float(vs[-1])
        if now - ts[-1] > history.max_gap:
            self._episodes.close(key, now)
            return self._quiet(f"stale data: last point is {now - ts[-1]:.0f}s old "
                               f"(max gap {history.max_gap:.0f}s)", current)
        if np.ptp(vs) == 0:
            self._episodes.close(key, now)
            return self._quiet("constant series: no trend to extrapolate", current)
        evidence = tuple((float(t), float(v)) for t, v in zip(ts[-_EVIDENCE_POINTS:], vs[-_EVIDENCE_POINTS:]))
        if self._beyond(current):
            self._episodes.touch(key, now)  # the incident goes on; keep its dedup key
            return Detection(detector=KIND, fired=False, value=current, threshold=p.threshold,
                             reason=f"already breaching ({current:g} vs {p.threshold:g}): "
                                    "the tail detector's case, not a forecast",
                             evidence=evidence)
        curves = self._forecaster.curves(key, history, now)
        if isinstance(curves, str):
            self._episodes.close(key, now)
            return self._quiet(curves, current)
        window = (curves.times > now) & (curves.times <= now + p.horizon_seconds)
        t, point, outer = curves.times[window], curves.point[window], curves.outer[window]
        if not t.size:
            self._episodes.close(key, now)
            return self._quiet("forecast does not cover the horizon", current, **curves.info)
        curve = outer if p.bound == "upper" else point
        breach_t = first_crossing(t, curve, p.threshold, p.direction, float(ts[-1]), current)
        extreme = float(curve.max() if p.direction == "above" else curve.min())
        forecast_rows = _downsample_rows(t, point, outer)
        if breach_t is None:
            self._episodes.close(key, now)
            return Detection(
                detector=KIND, fired=False, value=current, threshold=p.threshold, score=extreme,
                reason=f"{p.model} {p.bound} forecast stays "
                       f"{'below' if p.direction == 'above' else 'above'} {p.threshold:g} for "
                       f"{p.horizon_seconds:.0f}s (extreme {extreme:.6g})",
                details={**curves.info, "forecast": forecast_rows},
            )
        breach_t = max(breach_t, now)
        start = self._episodes.touch(key, now)
        lead = breach_t - now
        return Detection(
            detector=KIND, fired=True, value=current, threshold=p.threshold, score=extreme,
            baseline=float(point[-1]), episode_start=start, evidence=evidence,
            reason=f"{p.model} {p.bound} forecast crosses {p.threshold:g} in {lead:.0f}s "
                   f"(now {current:.6g})",
            details={**curves.info, "predicted_breach_time": breach_t, "lead_time_seconds": lead,
                     "forecast": forecast_rows,
                     "forecast_columns": ["time", "point", "bound"]},
        )
