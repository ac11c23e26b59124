"""TailExcessDetector: "P99.9 > L" decided from cumulative counters by a CUSUM (see _excess_cusum).

Counter input (`input: counters`, the default): `query` is a cumulative latency counter (Triton's `nv_inference_compute_infer_duration_us`,
or `..._request_duration_us`), `companionQuery` the matching request counter
(`nv_inference_request_success`), both raw (no `rate()`), one series per model version. The
counters move with the very first slow response, where Triton's summary quantile needs the 5th
(docs/stack-facts.md); the test then decides how much of that is a tail and how sure it is.

Value input (`input: values`): `query` is any latency series (a recorded P99.9, a histogram
quantile); a CUSUM on its robust score decides (detectors/value_cusum.py). This is the path NAB
scores (docs/detectors.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Literal, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray
from pydantic import Field, model_validator

from core.detection import Detection
from core.query import Series
from detectors._counter_steps import counter_steps
from detectors._excess_cusum import CusumRun, CusumTerms, run_cusum
from detectors._grid import align
from detectors.base import DetectorParams, Offload, detect_each
from detectors import value_cusum
from detectors.value_cusum import ValueCusumBatch, ValueCusumParams, evaluate_value_cusum

OK, NO_DATA, STALE, SHORT_HISTORY, NO_COUNTS = range(5)


class TailExcessParams(DetectorParams):
    """Parameters of `tail_excess`. Defaults are the production ones (docs/detectors.md)."""

    input: Literal["counters", "values"] = "counters"
    """`counters`: latency and request counters (the default, and the fastest evidence);
    `values`: one latency series, decided by the value path (`values:` holds its parameters)."""
    line: float | None = Field(None, gt=0)
    """L: the latency the quantile must stay under, in the counter's unit per request (500000
    for Triton's `_us` counters and 500 ms). Required with counters; no default, because a line
    that carries a unit cannot have one."""
    values: ValueCusumParams = ValueCusumParams()
    """Parameters of the value path (`input: values`)."""
    quantile: float = Field(0.999, gt=0.5, lt=1.0)
    """The quantile the line is for; p0 = 1 - quantile is the slow-request rate H0 allows."""
    rate_ratio: float = Field(10.0, gt=1.0)
    """H1 = rate_ratio x p0: the tail the test is quickest on (1% of requests above L for P99.9)."""
    decision_threshold: float = Field(13.0, gt=0)
    """h, in nats: the CUSUM level that fires. Higher is fewer false alarms and later detection."""
    lookback_seconds_: float = Field(900.0, gt=0, alias="lookback_seconds")
    """How much history each cycle recomputes the test from."""
    bulk_window_seconds: float = Field(60.0, gt=0)
    """The bulk's per-request latency is the lowest step mean of this trailing window."""
    bulk_slack: float = Field(0.25, ge=0)
    """Each request may take (1 + this) x the bulk before it counts as excess: a bulk that slows
    down by less than this (3x traffic, a slightly slower version) is not a tail."""
    max_staleness_seconds: float = Field(30.0, gt=0)
    """Newest sample older than this: stale data, never read as healthy or as firing."""

    @model_validator(mode="after")
    def _line_with_counters(self) -> "TailExcessParams":
        if self.input == "counters" and self.line is None:
            raise ValueError("'line' is required with input: counters (the latency line in the "
                             "counter's unit per request, e.g. 500000 for 500 ms in microseconds)")
        return self

    @property
    def counter_line(self) -> float:
        assert self.line is not None  # the validator requires it with counters
        return self.line


@dataclass(frozen=True)
class RowFacts:
    """The per-row numbers of an `ExcessBatch` as Python lists, [S] each: one `.tolist()` per array
    for the whole batch, where reading numpy scalars row by row cost most of one Detection."""

    timestamps: list[float]  # the grid, [P]
    status: list[int]
    fired: list[bool]
    latest: list[int]
    first_seen: list[int]
    statistic: list[float]  # the CUSUM after the last column, 0.0 on an empty grid
    last_allowance: list[float]  # the allowance at the row's last scored step, NaN if none
    scored_steps: list[int]
    resets: list[int]
    episode_start: list[int]
    episode_units: list[float]
    episode_requests: list[float]


@dataclass(frozen=True)
class ExcessBatch:
    """One evaluation of S series on one grid of P timestamps."""

    timestamps: NDArray[np.float64]
    run: CusumRun
    status: NDArray[np.int8]
    fired: NDArray[np.bool_]
    latest: NDArray[np.int_]  # newest column with both counters, -1 if none
    first_seen: NDArray[np.int_]  # first column with both counters, -1 if none
    resets: NDArray[np.int_]  # counter resets (server restarts) seen in the lookback

    @cached_property
    def facts(self) -> RowFacts:
        """The per-row numbers every Detection reads, computed once for all rows."""
        run, rows = self.run, self.status.shape[0]
        return RowFacts(
            timestamps=self.timestamps.tolist(), status=self.status.tolist(), fired=self.fired.tolist(),
            latest=self.latest.tolist(), first_seen=self.first_seen.tolist(),
            statistic=run.statistic[:, -1].tolist() if self.timestamps.size else [0.0] * rows,
            last_allowance=_last_where(run.allowance, run.scored).tolist(),
            scored_steps=run.scored.sum(axis=1).tolist(), resets=self.resets.tolist(),
            episode_start=run.episode_start.tolist(), episode_units=run.episode_units.tolist(),
            episode_requests=run.episode_requests.tolist(),
        )


def _last_where(x: NDArray[np.float64], mask: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Per row, `x` at the last column where `mask` holds; NaN where it holds nowhere."""
    rows, cols = x.shape
    if cols == 0:
        return np.full(rows, np.nan)
    last = cols - 1 - np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), x[np.arange(rows), last], np.nan)


def _step_seconds(grid: NDArray[np.float64]) -> float:
    return float(np.median(np.diff(grid))) if grid.size > 1 else 1.0


def evaluate_excess_batch(p: TailExcessParams, grid: NDArray[np.float64], latency: NDArray[np.float64],
                          requests: NDArray[np.float64], now: float) -> ExcessBatch:
    """Decide every row of aligned counters [S x P] on `grid` (ascending, as `align` makes it);
    pure and vectorized over series."""
    # The grid is sorted, so the lookback is its tail: sliced as views, not copied by a mask.
    first_col = int(np.searchsorted(grid, now - p.lookback_seconds_, side="left"))
    grid = grid[first_col:]
    latency, requests = latency[:, first_col:], requests[:, first_col:]
    steps = counter_steps(latency, requests)
    terms = CusumTerms(
        line=p.counter_line, p0=1.0 - p.quantile, rate_ratio=p.rate_ratio, decision=p.decision_threshold,
        bulk_window_cols=max(1, int(round(p.bulk_window_seconds / _step_seconds(grid)))),
        bulk_slack=p.bulk_slack,
    )
    run = run_cusum(steps, terms)
    valid = np.isfinite(latency) & np.isfinite(requests)
    cols = np.arange(grid.size)
    latest = np.where(valid.any(axis=1), np.max(np.where(valid, cols, -1), axis=1), -1)
    status = np.full(latency.shape[0], OK, dtype=np.int8)
    status[~run.scored.any(axis=1)] = SHORT_HISTORY
    status[(latest >= 0) & (grid[np.maximum(latest, 0)] < now - p.max_staleness_seconds)] = STALE
    status[~np.isfinite(requests).any(axis=1)] = NO_COUNTS
    status[latest < 0] = NO_DATA
    last_stat = run.statistic[:, -1] if grid.size else np.zeros(latency.shape[0])
    fired = (status == OK) & (last_stat >= p.decision_threshold)
    return ExcessBatch(grid, run, status, fired, latest, steps.first_valid, steps.resets.sum(axis=1))


def _fmt(v: float) -> str:
    return f"{v:.4g}" if math.isfinite(v) else "nan"


@dataclass(frozen=True)
class _Texts:
    """The parts of the reason lines that are the same for every row of a batch, formatted once."""

    line: str | None  # L; None without one (`counter_line` raises where a row needs it, as it did)
    allowed: str  # the slow share H0 allows
    threshold: str  # h
    staleness: str  # max_staleness_seconds

    @classmethod
    def of(cls, p: TailExcessParams) -> "_Texts":
        return cls(_fmt(p.line) if p.line is not None else None, f"{1 - p.quantile:.2%}",
                   f"{p.decision_threshold:g}", f"{p.max_staleness_seconds:g}")


def batch_detections(b: ExcessBatch, p: TailExcessParams, kind: str,
                     labels: Sequence[Mapping[str, str]]) -> list[Detection]:
    """The Detection of every row (`labels`: each row's series labels), with a one-line reason
    either way and attribution details; the parts of the reason every row shares formatted once."""
    texts = _Texts.of(p)
    return [_row_detection(b, row, p, kind, row_labels, texts) for row, row_labels in enumerate(labels)]


def _row_detection(b: ExcessBatch, row: int, p: TailExcessParams, kind: str, labels: Mapping[str, str],
                   texts: _Texts) -> Detection:
    """The Detection of one row, the batch's constant texts given. No closure per row: a function
    and its cells per row cost time and were that many more objects for the cyclic GC to walk."""
    f = b.facts
    status, latest, first, stat = f.status[row], f.latest[row], f.first_seen[row], f.statistic[row]
    bulk = f.last_allowance[row] / (1.0 + p.bulk_slack)  # NaN when no step was scored
    units, reqs = f.episode_units[row], f.episode_requests[row]
    details: dict[str, Any] = {
        "input": "counters", "cusum": stat, "episode_slow_equivalents": units, "episode_requests": reqs,
        "scored_steps": f.scored_steps[row], "counter_resets": f.resets[row],
    }
    if "version" in labels:
        details["version"] = labels["version"]
    if first >= 0:
        details["series_first_seen"] = f.timestamps[first]
    fired, onset = False, None
    evidence: tuple[tuple[float, float], ...] = ()
    if status == NO_DATA:
        reason = "no data: no samples of both counters in the lookback window"
    elif status == NO_COUNTS:
        reason = "no request counter: tail_excess needs companionQuery (the request count)"
    elif status == STALE:
        reason = f"stale: newest sample at {f.timestamps[latest]:.0f} is older than {texts.staleness} s"
    elif status == SHORT_HISTORY:
        reason = "too little history: no step with a bulk to compare against yet"
    else:
        line = texts.line if texts.line is not None else _fmt(p.counter_line)  # (raises without a line)
        if not f.fired[row] and f.episode_start[row] < 0:
            reason = f"no excess over the bulk ({_fmt(bulk)} per request); CUSUM 0"
        else:
            share = units / reqs if reqs > 0 else 0.0
            what = (f"~{units:.1f} requests' worth of latency above {line} in {reqs:.0f} requests "
                    f"({share:.2%} vs {texts.allowed} allowed); CUSUM {stat:.2f}")
            if not f.fired[row]:
                reason = f"{what} < {texts.threshold}"
            else:
                fired, reason = True, f"{what} >= {texts.threshold}"
                onset, evidence = _fired_evidence(b, row, details)
    return Detection(detector=kind, fired=fired, reason=reason, value=stat,
                     baseline=bulk if math.isfinite(bulk) else None, threshold=p.decision_threshold,
                     score=stat / p.decision_threshold, episode_start=onset, evidence=evidence,
                     details=details)


def _fired_evidence(b: ExcessBatch, row: int, details: dict[str, Any]) -> tuple[float, tuple[tuple[float, float], ...]]:
    """A fired row's onset and evidence (its last 20 steps with excess), read from the arrays
    directly (a few dozen rows per cycle); adds the onset's delay to `details`."""
    f = b.facts
    start, first = f.episode_start[row], f.first_seen[row]
    onset = f.timestamps[start]
    if first >= 0:
        details["onset_after_first_sample_s"] = onset - f.timestamps[first]
    ts, run = b.timestamps, b.run
    evidence_cols = np.flatnonzero(np.nan_to_num(run.units[row]) > 0)
    evidence_cols = evidence_cols[evidence_cols >= start][-20:]
    return onset, tuple((float(ts[i]), float(run.units[row, i])) for i in evidence_cols)


def value_detection(b: ValueCusumBatch, row: int, grid: NDArray[np.float64], p: ValueCusumParams,
                    kind: str) -> Detection:
    """The Detection for one row of the value path, with a one-line reason either way."""
    status, latest, start = int(b.status[row]), int(b.latest[row]), int(b.episode_start[row])
    stat, h = float(b.statistic[row]), float(b.threshold[row])
    base, value = float(b.baseline[row]), float(b.value[row])
    details: dict[str, Any] = {"input": "values", "scale": float(b.scale[row]),
                               "truncated": bool(b.truncated[row]), "direction": int(b.direction[row])}

    def make(fired: bool, reason: str, **kw: Any) -> Detection:
        return Detection(detector=kind, fired=fired, reason=reason,
                         value=value if np.isfinite(value) else None,
                         baseline=base if np.isfinite(base) else None, threshold=h,
                         score=stat / h if h > 0 else None, details=details, **kw)

    if status == value_cusum.NO_DATA:
        return make(False, "no data: no finite points in the lookback window")
    if status == value_cusum.STALE:
        return make(False, f"stale: newest point at {grid[latest]:.0f} is older than "
                           f"{p.max_staleness_seconds:g} s")
    if status == value_cusum.SHORT_HISTORY:
        return make(False, f"too little history: fewer than {p.min_baseline_points} baseline points")
    what = f"CUSUM {stat:.2f} (line {h:.2f}), latest {_fmt(value)}, baseline {_fmt(base)}"
    if not b.fired[row]:
        if b.truncated[row]:
            return make(False, f"{what}: the excursion reaches back past the lookback, its start is "
                               "unknown (not acted on again; not a recovery either)")
        return make(False, what)
    return make(True, what, episode_start=float(grid[start]),
                evidence=((float(grid[latest]), value),))


class TailExcessDetector:
    """Sequential tail detector on counters (or one value series). Stateless: each cycle
    recomputes the test from the queried range, so restarts and failovers lose nothing and one
    episode keeps one start."""

    kind: ClassVar[str] = "tail_excess"
    Params: ClassVar[type[DetectorParams]] = TailExcessParams

    def __init__(self, params: TailExcessParams | Mapping[str, Any]) -> None:
        self.params = (params if isinstance(params, TailExcessParams)
                       else TailExcessParams.model_validate(params))

    @property
    def lookback_seconds(self) -> float:
        if self.params.input == "values":
            return self.params.values.lookback_seconds
        return self.params.lookback_seconds_

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        """Nothing to prepare: everything comes from the queried range."""
        return None

    def detect(self, series: Series, now: float, companion: Series | None = None) -> Detection:
        """Decide on one series (with counters: the latency counter, its request counter as
        `companion`). Never raises for bad data."""
        if self.params.input == "counters" and companion is None:
            return Detection(self.kind, False, "no request counter: tail_excess needs companionQuery "
                                               "(the request count) with the same labels")
        try:
            return self.detect_many([series], now, [companion] if companion is not None else None)[0]
        except (TypeError, ValueError) as exc:
            return Detection(self.kind, False, f"malformed series: {exc}")

    def detect_many(self, series: Sequence[Series], now: float,
                    companions: Sequence[Series | None] | None = None) -> list[Detection]:
        """Aligns the series (with counters: each latency counter and its request counter) on one
        grid and decides all rows at once. Raises on malformed series (see `align`)."""
        if not series:
            return []
        if self.params.input == "values":
            grid, values = align(series)
            vb = evaluate_value_cusum(self.params.values, grid, values, now)
            return [value_detection(vb, i, grid, self.params.values, self.kind) for i in range(len(series))]
        if companions is None or any(c is None for c in companions):
            return detect_each(self.detect, series, now,
                               companions if companions is not None else [None] * len(series))
        paired = [c for c in companions if c is not None]
        grid, counters = align([*series, *paired])
        n = len(series)
        batch = evaluate_excess_batch(self.params, grid, counters[:n], counters[n:], now)
        return batch_detections(batch, self.params, self.kind, [s.labels for s in series])
