"""`ForecastBreachParams`: the policy's parameters of the forecast breach detector, validated
strictly (unknown keys are load errors) and with durations such as ``"15m"``."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from core.durations import parse_duration
from detectors.base import DetectorParams


class ForecastBreachParams(DetectorParams):
    """Parameters of `ForecastBreachDetector`; durations accept ``"15m"`` or seconds."""

    model: Literal["holt", "prophet"] = "holt"
    """Forecaster. Holt by default: it follows the last hour's ramp, refits every cycle for
    ~0.2 ms a series, and needs no warm-up; Prophet pays off for seasonal series (daily cycles)."""
    threshold: float
    """Breach level, in the series' unit."""
    direction: Literal["above", "below"] = "above"
    """Breach when the series goes above (latency) or below (throughput) the threshold."""
    horizon_seconds: float = Field(900.0, gt=0)
    """How far ahead a predicted crossing counts."""
    lookback_seconds: float = Field(21600.0, gt=0)
    """History the poller range-queries (6h default; use 7d for Prophet's weekly seasonality)."""
    bound: Literal["point", "upper"] = "point"
    """Curve that must cross: the point forecast, or the interval's edge on the breach side
    (the upper edge for ``above``, the lower edge for ``below``)."""
    interval_width: float = Field(0.8, gt=0, lt=1)
    """Two-sided prediction interval width (Prophet's meaning); ``upper`` is its (1+w)/2 quantile."""
    uncertainty_samples: int = Field(200, ge=10)
    """Prophet simulation draws, used only when ``bound`` is ``upper`` (0 otherwise: it is costly)."""
    refit_interval_seconds: float = Field(900.0, gt=0)
    """Prophet: each series refits once per interval, at a slot staggered by a hash of its key."""
    max_fits_per_cycle: int = Field(32, ge=1)
    """Prophet: fits sent to the pool per cycle; needs >= series * poll_interval / refit_interval."""
    min_history_points: int = Field(60, ge=10)
    """Fewer usable points in the lookback (or since the last gap, for Holt) means no decision."""
    step_seconds: float | None = Field(None, gt=0)
    """The series' sampling step; ``None`` infers it as the median spacing."""
    max_gap_seconds: float | None = Field(None, gt=0)
    """Longer gaps break Holt's history and make data stale; ``None`` means 4 steps."""
    holt_fit_points: int = Field(360, ge=10)
    """Holt fits on at most this many latest points of the regularized series."""
    prophet_max_points: int = Field(2000, ge=100)
    """Prophet fits on group means of at most this many points (its cost grows with n)."""

    @field_validator(
        "horizon_seconds", "lookback_seconds", "refit_interval_seconds", "step_seconds",
        "max_gap_seconds", mode="before",
    )
    @classmethod
    def _durations(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)

    @model_validator(mode="after")
    def _fits(self) -> "ForecastBreachParams":
        if self.horizon_seconds >= self.lookback_seconds:
            raise ValueError("horizon_seconds must be shorter than lookback_seconds")
        return self
