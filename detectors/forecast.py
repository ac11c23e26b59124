"""ForecastBreachDetector: predicts that a series will cross its threshold within a horizon.

Holt (damped trend) refits every cycle; Prophet refits off the loop on a staggered schedule and
`detect` only compares its cached forecast with the threshold.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, ClassVar, Literal, Mapping, Sequence

import numpy as np
from pydantic import Field, field_validator, model_validator

from core.detection import Detection
from core.durations import parse_duration
from core.query import Series
from detectors._holt import HoltFit, fit_holt, holt_forecast
from detectors._prophet_fit import ProphetForecast, fit_prophet_forecast
from detectors.base import DetectorParams, Offload

KIND = "forecast_breach"
# Below this many equally long series, shipping a batch to the pool costs more than fitting inline.
_HOLT_BATCH_MIN = 16
_DETAIL_POINTS = 20  # forecast points kept in Detection.details (the journal, not the math)
_EVIDENCE_POINTS = 10
_ANCHOR_POINTS = 5


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


# --- pure functions over arrays -------------------------------------------------------------


def series_key(labels: Mapping[str, str]) -> str:
    """Stable identity of a series: its sorted label set."""
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def clean_history(
    timestamps: Sequence[float], values: Sequence[float], now: float, lookback_seconds: float
) -> tuple[np.ndarray, np.ndarray]:
    """Finite points within ``[now - lookback, now]``, sorted, one per timestamp (the last wins)."""
    ts = np.asarray(timestamps, dtype=np.float64).ravel()
    vs = np.asarray(values, dtype=np.float64).ravel()
    if ts.size != vs.size:
        raise ValueError(f"{ts.size} timestamps but {vs.size} values")
    keep = np.isfinite(ts) & np.isfinite(vs) & (ts <= now) & (ts >= now - lookback_seconds)
    ts, vs = ts[keep], vs[keep]
    order = np.argsort(ts, kind="stable")
    ts, vs = ts[order], vs[order]
    if ts.size > 1:
        last_of_run = np.append(ts[1:] != ts[:-1], True)
        ts, vs = ts[last_of_run], vs[last_of_run]
    return ts, vs


def infer_step(timestamps: np.ndarray) -> float:
    """Median spacing of ascending timestamps (a Prometheus range query's step)."""
    d = np.diff(timestamps)
    return float(np.median(d)) if d.size else 0.0


def regularize(
    timestamps: np.ndarray, values: np.ndarray, step: float, max_gap: float
) -> tuple[np.ndarray, np.ndarray]:
    """The series on a grid of ``step`` ending at its last point, linearly interpolated,
    keeping only the stretch after the last gap longer than ``max_gap`` (Holt has no notion of
    missing data, and bridging a long gap with a straight line would invent a trend)."""
    if timestamps.size < 2:
        return timestamps.copy(), values.copy()
    big = np.nonzero(np.diff(timestamps) > max_gap)[0]
    start = timestamps[big[-1] + 1] if big.size else timestamps[0]
    n = int(math.floor((timestamps[-1] - start) / step + 1e-9)) + 1
    grid = timestamps[-1] - step * np.arange(n - 1, -1, -1, dtype=np.float64)
    return grid, np.interp(grid, timestamps, values)


def first_crossing(
    times: np.ndarray, curve: np.ndarray, threshold: float, direction: str,
    start_time: float, start_value: float,
) -> float | None:
    """Time the curve first reaches the threshold, linearly interpolated from the point before
    (the first forecast point is interpolated from ``(start_time, start_value)``); None if never."""
    sign = 1.0 if direction == "above" else -1.0
    over = sign * (curve - threshold) >= 0
    hits = np.nonzero(over)[0]
    if not hits.size:
        return None
    i = int(hits[0])
    t0, v0 = (start_time, start_value) if i == 0 else (float(times[i - 1]), float(curve[i - 1]))
    t1, v1 = float(times[i]), float(curve[i])
    if v1 == v0 or sign * (v0 - threshold) >= 0:
        return t1 if sign * (v0 - threshold) < 0 else t0
    return t0 + (threshold - v0) / (v1 - v0) * (t1 - t0)


def refit_phase_seconds(key: str, interval_seconds: float) -> float:
    """Where in each refit interval this series refits: a stable hash of its key, so 1,000
    series spread evenly over the interval instead of all refitting in the same cycle."""
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return (h / 2.0**64) * interval_seconds


def next_refit_time(last_attempt: float, phase: float, interval_seconds: float) -> float:
    """The first slot ``phase + k * interval`` strictly after ``last_attempt``."""
    k = math.floor((last_attempt - phase) / interval_seconds) + 1
    return phase + k * interval_seconds


def refit_due(last_attempt: float | None, phase: float, interval_seconds: float, now: float) -> bool:
    """Never fitted, or this series' slot has come round since its last attempt."""
    return last_attempt is None or now >= next_refit_time(last_attempt, phase, interval_seconds)


def anchor_offset(ts: np.ndarray, vs: np.ndarray, curve_times: np.ndarray, curve: np.ndarray,
                  points: int = _ANCHOR_POINTS) -> float:
    """Median gap between the latest actuals and a cached curve (over the curve's span): how far
    the series has moved off a forecast that may be a refit interval old."""
    recent = (ts >= curve_times[0]) & (ts <= curve_times[-1])
    rts, rvs = ts[recent][-points:], vs[recent][-points:]
    return float(np.median(rvs - np.interp(rts, curve_times, curve))) if rts.size else 0.0


def _downsample_rows(*cols: np.ndarray, points: int = _DETAIL_POINTS) -> list[list[float]]:
    n = cols[0].size
    idx = np.unique(np.linspace(0, n - 1, min(points, n)).round().astype(int)) if n else []
    return [[round(float(c[i]), 6) for c in cols] for i in idx]


# --- the detector ---------------------------------------------------------------------------


@dataclass
class _ProphetState:
    phase: float
    last_seen: float
    last_attempt: float | None = None
    forecast: ProphetForecast | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class _Curves:
    times: np.ndarray
    point: np.ndarray
    outer: np.ndarray  # the interval edge on the breach side
    info: Mapping[str, Any]


class ForecastBreachDetector:
    """Fires while the series is still on the safe side but its forecast crosses the threshold
    within ``horizon_seconds``. A breach already under way is left to the tail detector: this
    one's value is the lead time, and the episode stays open so re-crossing is not a new one."""

    kind: ClassVar[str] = KIND
    Params: ClassVar[type[DetectorParams]] = ForecastBreachParams

    def __init__(self, params: ForecastBreachParams | Mapping[str, Any]) -> None:
        self.params: ForecastBreachParams = (
            params if isinstance(params, ForecastBreachParams)
            else ForecastBreachParams.model_validate(params)
        )
        self._z = NormalDist().inv_cdf((1.0 + self.params.interval_width) / 2.0)
        self._episodes: dict[str, tuple[float, float]] = {}  # key -> (start, last active)
        self._prophet: dict[str, _ProphetState] = {}
        self._holt_cache: dict[str, tuple[float, float, int, HoltFit]] = {}

    @property
    def lookback_seconds(self) -> float:
        return self.params.lookback_seconds

    # prepare: the only place heavy work is started, always through offload --------------------

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        """Holt: batch-fit equally long series in the pool. Prophet: refit series whose slot is due."""
        if self.params.model == "holt":
            await self._prepare_holt(batch, now, offload)
        else:
            await self._prepare_prophet(batch, now, offload)

    async def _prepare_holt(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        self._holt_cache = {}
        groups: dict[int, list[tuple[str, float, np.ndarray]]] = {}
        for s in batch:
            prepared = self._holt_window(s, now)
            if prepared is not None:
                key, last_t, window = prepared
                groups.setdefault(window.size, []).append((key, last_t, window))
        for n, items in groups.items():
            if len(items) < _HOLT_BATCH_MIN:
                continue  # detect fits these inline
            try:
                fit: HoltFit = await offload(fit_holt, np.stack([w for _, _, w in items]), None)
            except Exception:  # a pool failure only costs speed: detect fits inline instead
                continue
            for i, (key, last_t, _) in enumerate(items):
                self._holt_cache[key] = (now, last_t, n, fit.row(i))

    def _holt_window(self, s: Series, now: float) -> tuple[str, float, np.ndarray] | None:
        try:
            ts, vs = clean_history(s.timestamps, s.values, now, self.params.lookback_seconds)
        except ValueError:  # malformed series: detect reports it
            return None
        if ts.size < self.params.min_history_points:
            return None
        step = self.params.step_seconds or infer_step(ts)
        grid, gv = regularize(ts, vs, step, self.params.max_gap_seconds or 4 * step)
        if grid.size < self.params.min_history_points or np.ptp(gv) == 0:
            return None
        return series_key(s.labels), float(grid[-1]), gv[-self.params.holt_fit_points :]

    async def _prepare_prophet(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        p = self.params
        seen = set()
        due: list[tuple[int, float, str, np.ndarray, np.ndarray]] = []
        for s in batch:
            key = series_key(s.labels)
            seen.add(key)
            st = self._prophet.get(key)
            if st is None:
                st = self._prophet[key] = _ProphetState(
                    phase=refit_phase_seconds(key, p.refit_interval_seconds), last_seen=now
                )
            st.last_seen = now
            if not refit_due(st.last_attempt, st.phase, p.refit_interval_seconds, now):
                continue
            try:
                ts, vs = clean_history(s.timestamps, s.values, now, p.lookback_seconds)
            except ValueError as exc:  # malformed series: remember why, detect reports it
                st.last_error = str(exc)
                continue
            if ts.size < p.min_history_points or np.ptp(vs) == 0:
                continue  # not worth a fit yet; retried next cycle as history grows
            overdue = now - (next_refit_time(st.last_attempt, st.phase, p.refit_interval_seconds)
                             if st.last_attempt is not None else now)
            # never-fitted series first, then the most overdue: a startup storm drains in order
            due.append((0 if st.forecast is None else 1, -overdue, key, ts, vs))
        for key in [k for k, st in self._prophet.items()
                    if k not in seen and now - st.last_seen > p.lookback_seconds]:
            del self._prophet[key]  # series gone for a whole lookback: forget its model
        due.sort(key=lambda d: (d[0], d[1]))
        due = due[: p.max_fits_per_cycle]
        if not due:
            return

        def job(key: str, ts: np.ndarray, vs: np.ndarray) -> Any:
            st = self._prophet[key]
            fn = functools.partial(
                fit_prophet_forecast,
                ahead_seconds=p.horizon_seconds + 2 * p.refit_interval_seconds,
                step_seconds=p.step_seconds or infer_step(ts),
                init=st.forecast.init if st.forecast is not None else None,
                interval_width=p.interval_width,
                uncertainty_samples=p.uncertainty_samples if p.bound == "upper" else 0,
                max_points=p.prophet_max_points,
            )
            return offload(fn, ts, vs)

        results = await asyncio.gather(*(job(k, ts, vs) for _, _, k, ts, vs in due),
                                       return_exceptions=True)
        for (_, _, key, _, _), res in zip(due, results):
            st = self._prophet[key]
            st.last_attempt = now  # also on failure, so a failing series waits for its next slot
            if isinstance(res, asyncio.CancelledError):
                raise res
            if isinstance(res, BaseException):  # keep the previous forecast, report the error
                st.last_error = f"{type(res).__name__}: {res}"
            else:
                st.forecast, st.last_error = res, None

    # detect: cheap, pure given the prepared state ----------------------------------------------

    def detect(self, series: Series, now: float) -> Detection:
        """Decide on one series. Never raises for bad data: returns fired=False with a reason."""
        try:
            return self._detect(series, now)
        except Exception as exc:  # odd data or a bug here must not stop the poller
            return self._quiet(f"forecast failed: {type(exc).__name__}: {exc}")

    def _quiet(self, reason: str, value: float | None = None, **details: Any) -> Detection:
        return Detection(detector=KIND, fired=False, reason=reason, value=value,
                         threshold=self.params.threshold, details=details)

    def _beyond(self, v: float) -> bool:
        p = self.params
        return v >= p.threshold if p.direction == "above" else v <= p.threshold

    def _detect(self, series: Series, now: float) -> Detection:
        p = self.params
        key = series_key(series.labels)
        ts, vs = clean_history(series.timestamps, series.values, now, p.lookback_seconds)
        if ts.size < p.min_history_points:
            self._close_episode(key, now)
            return self._quiet(f"too little history: {ts.size} usable points in the lookback, "
                               f"need {p.min_history_points}")
        step = p.step_seconds or infer_step(ts)
        max_gap = p.max_gap_seconds or 4 * step
        current = float(vs[-1])
        if now - ts[-1] > max_gap:
            self._close_episode(key, now)
            return self._quiet(f"stale data: last point is {now - ts[-1]:.0f}s old "
                               f"(max gap {max_gap:.0f}s)", current)
        if np.ptp(vs) == 0:
            self._close_episode(key, now)
            return self._quiet("constant series: no trend to extrapolate", current)
        evidence = tuple((float(t), float(v)) for t, v in zip(ts[-_EVIDENCE_POINTS:], vs[-_EVIDENCE_POINTS:]))
        if self._beyond(current):
            self._touch_episode(key, now)  # the incident goes on; keep its dedup key
            return Detection(detector=KIND, fired=False, value=current, threshold=p.threshold,
                             reason=f"already breaching ({current:g} vs {p.threshold:g}): "
                                    "the tail detector's case, not a forecast",
                             evidence=evidence)
        curves = (self._holt_curves(key, ts, vs, step, max_gap, now) if p.model == "holt"
                  else self._prophet_curves(key, ts, vs, now))
        if isinstance(curves, str):
            self._close_episode(key, now)
            return self._quiet(curves, current)
        window = (curves.times > now) & (curves.times <= now + p.horizon_seconds)
        t, point, outer = curves.times[window], curves.point[window], curves.outer[window]
        if not t.size:
            self._close_episode(key, now)
            return self._quiet("forecast does not cover the horizon", current, **curves.info)
        curve = outer if p.bound == "upper" else point
        breach_t = first_crossing(t, curve, p.threshold, p.direction, float(ts[-1]), current)
        extreme = float(curve.max() if p.direction == "above" else curve.min())
        forecast_rows = _downsample_rows(t, point, outer)
        if breach_t is None:
            self._close_episode(key, now)
            return Detection(
                detector=KIND, fired=False, value=current, threshold=p.threshold, score=extreme,
                reason=f"{p.model} {p.bound} forecast stays "
                       f"{'below' if p.direction == 'above' else 'above'} {p.threshold:g} for "
                       f"{p.horizon_seconds:.0f}s (extreme {extreme:.6g})",
                details={**curves.info, "forecast": forecast_rows},
            )
        breach_t = max(breach_t, now)
        start = self._touch_episode(key, now)
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

    def _holt_curves(self, key: str, ts: np.ndarray, vs: np.ndarray, step: float,
                     max_gap: float, now: float) -> _Curves | str:
        p = self.params
        grid, gv = regularize(ts, vs, step, max_gap)
        if grid.size < p.min_history_points:
            return (f"gap: only {grid.size} points since the last gap longer than "
                    f"{max_gap:.0f}s, need {p.min_history_points}")
        window = gv[-p.holt_fit_points :]
        if np.ptp(window) == 0:
            return "constant series: no trend to extrapolate"
        cached = self._holt_cache.get(key)
        if cached and cached[0] == now and cached[1] == grid[-1] and cached[2] == window.size:
            fit = cached[3]
        else:
            fit = fit_holt(window)
        steps = int(math.ceil((now + p.horizon_seconds - grid[-1]) / step))
        point, se = holt_forecast(fit, max(steps, 1))
        sign = 1.0 if p.direction == "above" else -1.0
        times = grid[-1] + step * np.arange(1, point.shape[1] + 1)
        info = {"model": "holt", "alpha": float(fit.alpha[0]), "beta": float(fit.beta[0]),
                "phi": float(fit.phi[0]), "sigma": float(fit.sigma[0]), "step_seconds": step}
        return _Curves(times, point[0], point[0] + sign * self._z * se[0], info)

    def _prophet_curves(self, key: str, ts: np.ndarray, vs: np.ndarray, now: float) -> _Curves | str:
        p = self.params
        st = self._prophet.get(key)
        f = st.forecast if st else None
        if f is None:
            why = f" (last fit failed: {st.last_error})" if st and st.last_error else ""
            return f"no Prophet forecast yet: fit pending{why}"
        if f.times[-1] < now + p.horizon_seconds:
            return (f"Prophet forecast from {f.fitted_at:.0f} ends before now + horizon: "
                    "refit overdue")
        # Shift the cached curve by how far the latest actuals sit from it: the fit may be up to
        # a refit interval old, and a level change since then must show without waiting for it.
        offset = anchor_offset(ts, vs, f.times, f.yhat)
        outer = f.yhat_upper if p.direction == "above" else f.yhat_lower
        info = {"model": "prophet", "fitted_at": f.fitted_at, "fit_points": f.n_points,
                "warm_started": f.warm_started, "anchor_offset": offset}
        return _Curves(f.times, f.yhat + offset, outer + offset, info)

    # episodes: stable dedup keys across cycles -----------------------------------------------

    def _touch_episode(self, key: str, now: float) -> float:
        """The episode's start; a new one unless the last was active within a horizon (a forecast
        that flickers off for a cycle or two is the same incident, not a new one)."""
        ep = self._episodes.get(key)
        start = now if ep is None or now - ep[1] > self.params.horizon_seconds else ep[0]
        self._episodes[key] = (start, now)
        return start

    def _close_episode(self, key: str, now: float) -> None:
        ep = self._episodes.get(key)
        if ep is not None and now - ep[1] > self.params.horizon_seconds:
            del self._episodes[key]
