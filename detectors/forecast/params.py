"""`ForecastBreachParams`: the policy's parameters of the forecast breach detector, validated
strictly (unknown keys are load errors) and with durations such as ``"15m"``."""
from __future__ import annotations

from typing import Any, Literal, Mapping

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from core.detection import RecoveryRule, Side
from core.durations import parse_duration
from detectors.base import DetectorParams

REPLACED = ("forecast_breach: bound, interval_width and uncertainty_samples were replaced by min_probability "
            "(act when P(the level reaches the threshold within horizon_seconds) is at least this) and "
            "min_lead_seconds (the predicted crossing at least this far ahead); docs/forecasting.md")
"""The load error of a policy written for the curve-crossing forecaster (one line)."""


class ForecastBreachParams(DetectorParams):
    """Parameters of `ForecastBreachDetector`; durations accept ``"15m"`` or seconds."""

    model: Literal["holt", "prophet"] = "holt"
    """Forecaster. Holt by default: it follows the last hours' ramp, fits in numpy and needs no
    warm-up; Prophet pays off only for series with a stable daily cycle (docs/forecasting.md)."""
    threshold: float
    """Breach level, in the series' unit."""
    direction: Literal["above", "below"] = "above"
    """Breach when the series' level goes above (latency) or below (throughput) the threshold."""
    min_probability: float = Field(0.9, gt=0, lt=1)
    """Act when P(the level reaches the threshold within the horizon) is at least this. The
    probability is calibrated on the series' own recent forecast errors: of the fires at 0.9, about
    nine in ten are followed by the crossing. Higher: fewer false fires, shorter leads."""
    min_lead_seconds: float = Field(60.0, ge=0)
    """Act only while the predicted crossing is at least this far ahead: a breach due sooner is
    already under way, the tail detector's case."""
    horizon_seconds: float = Field(900.0, gt=0)
    """How far ahead a crossing counts."""
    level_window_seconds: float = Field(300.0, ge=0)
    """The breach is the series' level, its mean over this window, reaching the threshold: a lone
    scrape over the line is noise, not a breach. Five minutes is the window the field reads P99.9
    over (``histogram_quantile(0.999, rate(..._bucket[5m]))``); a shorter one makes a noisy level
    that hovers under the line a breach the forecast must predict. At a step longer than the window
    it is the value."""
    cause: Literal["any", "version", "load"] = "any"
    """Which rises fire (detectors/forecast/attribution.py): "version" only a rise attributed to the
    served version (per-version series; not explained by the request rate; the previous version does
    not show it): a rollback's case; "load" only a rise the request rate explains (the capacity
    knee, needs companionQuery): a scale-out's case; "any" both, unattributed."""
    version_label: str = Field("version", min_length=1)
    """The series label that names the model version (Triton's metrics: `version`)."""
    errors: Literal["relative", "absolute"] = "relative"
    """How past forecast errors carry over to now: as a share of the level (latency's noise grows
    with it), or in the series' unit."""
    lookback_seconds: float = Field(21600.0, gt=0)
    """History the poller range-queries (6h default; use 7d for Prophet's weekly seasonality)."""
    holt_refit_seconds: float = Field(300.0, gt=0)
    """Holt: each series refits its smoothing parameters once per this interval (a staggered slot);
    every cycle filters the window again and recomputes the distribution."""
    refit_interval_seconds: float = Field(900.0, gt=0)
    """Prophet: each series refits once per interval, at a slot staggered by a hash of its key."""
    max_fits_per_cycle: int = Field(32, ge=1)
    """Prophet: fits sent to the pool per cycle; needs >= series * poll_interval / refit_interval."""
    min_history_points: int = Field(60, ge=30)
    """Fewer usable points in the lookback (or since the last gap) means no decision."""
    step_seconds: float | None = Field(None, gt=0)
    """The series' sampling step; ``None`` infers it as the median spacing."""
    max_gap_seconds: float | None = Field(None, gt=0)
    """A longer run of missed scrapes breaks the history (shorter ones are interpolated); ``None``
    means the longer of 10 minutes and 4 steps."""
    max_staleness_seconds: float | None = Field(None, gt=0)
    """Newest point older than this: stale data, no decision; ``None`` means 4 steps."""
    holt_fit_points: int = Field(360, ge=60)
    """The window: Holt fits, and every model calibrates, on at most this many latest points."""
    prophet_max_points: int = Field(2000, ge=100)
    """Prophet fits on group means of at most this many points (its cost grows with n)."""

    @model_validator(mode="before")
    @classmethod
    def _replaced_keys(cls, data: Any) -> Any:
        """A policy written for the curve-crossing forecaster fails in one line naming what replaced it."""
        if isinstance(data, Mapping) and any(k in data for k in ("bound", "interval_width", "uncertainty_samples")):
            raise PydanticCustomError("replaced_by_probability", REPLACED)
        return data

    @field_validator(
        "horizon_seconds", "lookback_seconds", "refit_interval_seconds", "step_seconds", "max_gap_seconds",
        "min_lead_seconds", "level_window_seconds", "holt_refit_seconds", "max_staleness_seconds", mode="before",
    )
    @classmethod
    def _durations(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)

    @model_validator(mode="after")
    def _fits(self) -> "ForecastBreachParams":
        if self.horizon_seconds >= self.lookback_seconds:
            raise ValueError("horizon_seconds must be shorter than lookback_seconds")
        if self.min_lead_seconds >= self.horizon_seconds:
            raise ValueError("min_lead_seconds must be shorter than horizon_seconds")
        return self

    def query_problem(self, query: str, companion_query: str | None) -> str | None:
        """A companion query is the request rate beside the latency (the capacity knee): Holt reads
        it, for a latency that breaches upwards."""
        if companion_query is None:
            if self.cause == "load":
                return ("forecast_breach: cause: load fires on a capacity knee, which needs companionQuery "
                        "(the request rate beside the latency)")
            return None
        if self.model != "holt":
            return ("forecast_breach: companionQuery (the request rate beside the latency, for a capacity "
                    "knee) is read by model: holt only")
        if self.direction != "above":
            return ("forecast_breach: companionQuery (the request rate, for a capacity knee) needs direction: "
                    "above (a latency that rises as the rate nears capacity)")
        return None

    @property
    def recovery_rule(self) -> RecoveryRule:
        """Guarding against a breach above `threshold` it recovers below it; below, above."""
        return RecoveryRule(Side.BELOW if self.direction == "above" else Side.ABOVE, self.threshold)

    def gap_seconds(self, step: float) -> float:
        return self.max_gap_seconds or max(600.0, 4 * step)

    def staleness_seconds(self, step: float) -> float:
        return self.max_staleness_seconds or 4 * step
