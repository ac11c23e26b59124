"""`ForecastBreachDetector`: asks its forecaster for a predictive distribution and fires while the
series' level is still on the safe side but P(it reaches the threshold within the horizon) is at
least `min_probability`, with the predicted crossing at least `min_lead_seconds` away."""
from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from core.detection import Detection, DetectorStatus, threshold_or_baseline
from core.query import Series
from detectors.base import DetectorParams, Offload, detect_each
from detectors.forecast.arrays import History
from detectors.forecast.attribution import attribute
from detectors.forecast.breach import Episodes
from detectors.forecast.calibration import MIN_PATHS, level_points
from detectors.forecast.history_memo import CycleHistories
from detectors.forecast.holt import HoltForecaster
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.prophet import ProphetForecaster
from detectors.forecast.protocol import Forecaster

KIND = "forecast_breach"
_EVIDENCE_POINTS = 10
FORECAST_COLUMNS = ["time", "point", "p10", "p50", "p90"]


class ForecastBreachDetector:
    """Fires while the series' level is still on the safe side but the probability that it
    reaches the threshold within ``horizon_seconds`` is at least ``min_probability``. The
    probability is read from the forecaster's predictive distribution: its point path plus the
    series' own recent forecast-error paths (detectors/forecast/calibration.py), recomputed from
    the queried range every cycle. A breach already under way is left to the tail detector: this
    one's value is the lead time, and the episode stays open so re-crossing is not a new one.

    Holt (damped trend, no trend learned from jumps) filters every cycle; Prophet refits off the
    loop on a staggered schedule and `detect` only anchors and calibrates its cached curve.
    """

    kind: ClassVar[str] = KIND
    Params: ClassVar[type[DetectorParams]] = ForecastBreachParams

    def __init__(self, params: ForecastBreachParams | Mapping[str, Any]) -> None:
        self.params: ForecastBreachParams = (
            params if isinstance(params, ForecastBreachParams)
            else ForecastBreachParams.model_validate(params)
        )
        # Holt's `prepare` and `detect` share the cycle's histories (each series read once).
        self._histories = CycleHistories(self.params)
        self._forecaster: Forecaster = (
            HoltForecaster(self.params, self._histories) if self.params.model == "holt"
            else ProphetForecaster(self.params)
        )
        self._episodes = Episodes(self.params.horizon_seconds)

    @property
    def lookback_seconds(self) -> float:
        return self.params.lookback_seconds

    @property
    def JUDGES_TOGETHER(self) -> bool:  # noqa: N802 (the attribute detectors.base.judges_together reads)
        """With a `cause`, a version's firing depends on its previous version's series in the same
        answer: the poller hands the whole answer to `detect_many`."""
        return self.params.cause != "any"

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload,
                      companions: Sequence[Series | None] | None = None) -> None:
        """The only place heavy work starts, always through offload: Holt refits the due series'
        parameters and filters all of them in one batch, Prophet refits the series whose slot is due.
        A companion is the series' request rate (the capacity knee)."""
        await self._forecaster.prepare(batch, now, offload, companions)

    def detect(self, series: Series, now: float, companion: Series | None = None) -> Detection:
        """Decide on one series; a companion is its request rate, which Holt reads for a capacity
        knee (detectors/forecast/load_knee.py). Never raises for bad data: returns fired=False with a
        reason."""
        p = self.params  # alone: no previous version to compare with
        return attribute([self._detect_safe(series, now, companion)], [series.labels], p.cause, p.version_label,
                         p.direction)[0]

    def detect_many(
        self, series: Sequence[Series], now: float, companions: Sequence[Series | None] | None = None
    ) -> list[Detection]:
        """One `detect` per series (the fits that batch well already ran in `prepare`), then each
        firing attributed to its version or to the load (detectors/forecast/attribution.py)."""
        found = detect_each(self._detect_safe, series, now, companions)
        p = self.params
        return attribute(found, [s.labels for s in series], p.cause, p.version_label, p.direction)

    def _detect_safe(self, series: Series, now: float, companion: Series | None) -> Detection:
        try:
            return self._detect(series, now, companion)
        except Exception as exc:  # odd data or a bug here must not stop the poller
            return self._quiet(f"forecast failed: {type(exc).__name__}: {exc}", status=DetectorStatus.FAILED)

    def _load(self, companion: Series | None, now: float) -> History | None:
        """The request rate's history beside a series, or None (none, or unreadable: the latency is
        then forecast alone)."""
        if companion is None:
            return None
        try:
            return self._histories.read(companion, now)
        except ValueError:  # a malformed rate series: the latency is forecast alone, not refused
            return None

    def _quiet(self, reason: str, value: float | None = None, status: DetectorStatus = DetectorStatus.OK,
               details: Mapping[str, Any] | None = None) -> Detection:
        return Detection(detector=KIND, fired=False, reason=reason, value=value,
                         threshold=self.params.threshold, details=dict(details or {}), status=status)

    def _beyond(self, v: float) -> bool:
        p = self.params
        return v >= p.threshold if p.direction == "above" else v <= p.threshold

    def _detect(self, series: Series, now: float, companion: Series | None) -> Detection:
        p = self.params
        key = self._histories.key(series, now)
        history = self._histories.read(series, now)
        ts, vs = history.timestamps, history.values
        if ts.size < p.min_history_points:
            self._episodes.close(key, now)
            return self._quiet(f"too little history: {ts.size} usable points in the lookback, "
                               f"need {p.min_history_points}", status=DetectorStatus.SHORT_HISTORY)
        current = float(vs[-1])
        if now - ts[-1] > history.max_staleness:
            self._episodes.close(key, now)
            return self._quiet(f"stale data: last point is {now - ts[-1]:.0f}s old "
                               f"(max staleness {history.max_staleness:.0f}s)", current, DetectorStatus.STALE)
        if vs.max() == vs.min():  # np.ptp(vs) == 0 for finite values, without its wrapper
            self._episodes.close(key, now)
            return self._quiet("constant series: no trend to extrapolate", current, DetectorStatus.CONSTANT)
        evidence = tuple(zip(ts[-_EVIDENCE_POINTS:].tolist(), vs[-_EVIDENCE_POINTS:].tolist()))
        points = level_points(p.level_window_seconds, history.step)
        level = float(np.mean(vs[-points:]))
        if self._beyond(level):
            self._episodes.touch(key, now)  # the incident goes on; keep its dedup key
            return Detection(detector=KIND, fired=False, value=current, threshold=p.threshold,
                             reason=f"already breaching (level {level:g} vs {p.threshold:g}): "
                                    "the tail detector's case, not a forecast",
                             evidence=evidence)
        forecast = self._forecaster.forecast(key, history, now, self._load(companion, now))
        if isinstance(forecast, str):
            self._episodes.close(key, now)
            return self._quiet(forecast, current)
        fp = forecast.passage
        if fp is None:
            self._episodes.close(key, now)
            return self._quiet(f"too few past forecasts to calibrate on: {forecast.paths} "
                               f"(need {MIN_PATHS})", current, DetectorStatus.SHORT_HISTORY, forecast.info)
        lead = None if fp.crossing_time is None else max(fp.crossing_time - now, 0.0)
        figures = {**forecast.info, "probability": round(fp.probability, 6), "min_probability": p.min_probability,
                   "predicted_crossing_time": fp.crossing_time, "lead_seconds": lead,
                   "min_lead_seconds": p.min_lead_seconds, "horizon_seconds": p.horizon_seconds,
                   "calibration_paths": fp.paths, "level": level,
                   "forecast": forecast.rows, "forecast_columns": FORECAST_COLUMNS}
        fired = fp.probability >= p.min_probability and lead is not None and lead >= p.min_lead_seconds
        shown = f"P(level reaches {p.threshold:g} within {p.horizon_seconds:.0f}s) = {fp.probability:.3f}"
        if not fired:
            self._episodes.close(key, now)
            why = (f"below min_probability {p.min_probability:g}" if fp.probability < p.min_probability
                   else f"predicted crossing in {lead or 0:.0f}s, under min_lead_seconds {p.min_lead_seconds:g}")
            return Detection(detector=KIND, fired=False, value=current, threshold=p.threshold,
                             score=fp.probability, reason=f"{p.model}: {shown}, {why}", details=figures)
        start = self._episodes.touch(key, now)
        assert lead is not None
        return Detection(
            detector=KIND, fired=True, value=current, threshold=p.threshold, score=fp.probability,
            baseline=float(forecast.point[-1]), episode_start=start, evidence=evidence,
            recovery_line=threshold_or_baseline(p.recovery_rule.good, p.threshold, float(forecast.point[-1])),
            reason=f"{p.model}: {shown}; predicted crossing in {lead:.0f}s (level now {level:.6g})",
            details=figures,
        )
