"""Forecast evaluation: calibrated breach probabilities (naive, Holt, Prophet) against the rule users
write today, ``predict_linear(x[30m|60m], H) > L``, on the NAB development series and on the
scenario library (evaluation/forecast_library.py). Prints markdown tables; docs/forecasting.md has
the figures and how to read them.

Run: ``python -m evaluation.forecast_eval [--datasets nab,library] [--workers 2]``.

Every step after the warm-up is a poll cycle that sees only the past: the window the detector
would fit (after the last long gap, at most `window_points`), the probability it would compute, and
whether it would fire (probability >= the knob and a predicted crossing at least `min_lead` away,
while the level is still under the line). What counts:

- a *crossing* is the level reaching the line: on NAB the value itself (the threshold is the P99 of
  the probationary values); in the library the noise-free level, known by construction;
- *precision*: fire episodes (fires no more than a horizon apart) followed, within the horizon of
  one of their fires, by the level at or over the line. A rule that fired at every step would score
  near 1 (its episodes end at crossings), so the tables also give the stricter *precision at the
  first fire*: the crossing within the horizon of the episode's first fire, when an action runs;
- *recall*: NAB, of rise crossings (the value rose over each of the 3 steps before it) with a fire
  in the horizon before them; library, of rise series signalled after the incident began and before
  the level crossed;
- *false fires per healthy series-day*: library fire episodes on healthy series and before a rise
  series' incident (NAB: episodes not followed by a crossing, per series-day);
- *reliability*: every decision step, predicted probability against whether the level reached the
  line within the horizon.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from detectors.forecast.calibration import (centered_level, first_passage_batch, level_points, level_weights,
                                            recency_weights)
from detectors.forecast.holt_paths import HoltParams
from detectors.forecast.arrays import clean_history, infer_step
from detectors.forecast.params import ForecastBreachParams
from evaluation import forecast_library
from evaluation.forecast_models import (Setup, holt_load_model_paths, holt_load_params, holt_model_paths,
                                        holt_params, naive_paths, predict_linear_rule, prophet_curve,
                                        prophet_model_paths)
from evaluation.nab_data import NabSeries, load_series

FLOAT = NDArray[np.float64]
LINE_MS = forecast_library.LINE_MS
THRESHOLD_QUANTILE = 99.0  # NAB: one rule for every series, P99 of the probationary values, "above"
RISE_STEPS = 3  # a rise crossing: the value rose over each of this many steps before it
MIN_HISTORY_POINTS = 60  # the detector's default
CHUNK = 256
PROB_KNOBS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99)
MARGIN_KNOBS = (-0.5, -0.3, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
"""predict_linear's knob: it fires when the line H ahead reaches L * (1 + margin)."""
RULES = {"predict_linear_30m": 1800.0, "predict_linear_60m": 3600.0}
CALIBRATED = ("naive", "holt", "prophet")
DEFAULT_MODEL = "holt"
DEFAULT_MIN_PROBABILITY = 0.9
DEFAULT_MIN_LEAD_SECONDS = 60.0
RELIABILITY_BINS = np.linspace(0.0, 1.0, 11)


def setup_for(dataset: str, step: float) -> Setup:
    """The detector's defaults, in this dataset's steps."""
    import dataclasses
    import os
    base = _setup_for(dataset, step)
    over = json.loads(os.environ.get("FORECAST_EVAL_SETUP", "{}"))  # experiments: override fields
    if "holt_select_horizon" in over:
        over["holt_select_steps"] = base.horizon_steps if over.pop("holt_select_horizon") else 0
    return dataclasses.replace(base, **over)


LEVEL_WINDOW_SECONDS = float(ForecastBreachParams.model_fields["level_window_seconds"].default)
"""The detector's default level window: the breach the probability is about."""
REFIT_INTERVAL_SECONDS = float(ForecastBreachParams.model_fields["refit_interval_seconds"].default)
"""The detector's default Prophet refit interval: the library refits at it, as the detector would."""


def _setup_for(dataset: str, step: float) -> Setup:
    if dataset == "nab":  # 5-30 min steps: a horizon of 3 steps (15 min at 5 min), the raw value
        return Setup(step, 3, level_points(LEVEL_WINDOW_SECONDS, step), 360, relative=True, half_life_paths=1e9,
                     holt_refit_steps=1, prophet_refit_steps=96, prophet_lookback_seconds=7 * 86400.0)
    return Setup(step, int(900.0 / step), level_points(LEVEL_WINDOW_SECONDS, step), 360, relative=True,
                 half_life_paths=1e9,
                 holt_refit_steps=int(300.0 / step), prophet_refit_steps=int(REFIT_INTERVAL_SECONDS / step),
                 prophet_lookback_seconds=6 * 3600.0)


@dataclass
class Stream:
    """One series on its grid, with where the detector decides and what then happened."""

    name: str
    dataset: str
    shape: str
    kind: str
    step: float
    y: FLOAT  # the series on the grid, missed scrapes interpolated
    truth: FLOAT  # the level whose crossing the probability states: the series' own, as the detector reads it
    threshold: float
    decide: NDArray[np.bool_]  # a poll cycle decides here (scrape seen, enough history)
    start: NDArray[np.intp]  # the window's first index per step
    segment: NDArray[np.intp]  # where the history of each step starts (after the last long gap)
    times: FLOAT  # the grid's unix times
    ts: FLOAT  # raw points (Prophet fits on them)
    vs: FLOAT
    incident: int | None = None  # library rise: first index of the incident
    crossing: int | None = None  # library rise: first index with the level at the line
    rate: FLOAT | None = None  # the request rate on the grid where the series has one (Holt's knee reads it)


def _segments(observed: NDArray[np.bool_], max_gap_steps: int) -> NDArray[np.intp]:
    """Per index, where its history starts: after the last run of missed scrapes longer than the gap."""
    idx = np.nonzero(observed)[0]
    starts = np.zeros(observed.size, dtype=np.intp)
    if idx.size:
        breaks = idx[1:][np.diff(idx) > max_gap_steps]
        marks = np.zeros(observed.size, dtype=np.intp)
        marks[breaks] = breaks
        starts = np.maximum.accumulate(marks)
    return starts


def stream_library(s: forecast_library.LibrarySeries, setup: Setup) -> Stream:
    observed = np.isfinite(s.values)
    idx = np.arange(s.values.size)
    y = np.interp(idx, idx[observed], s.values[observed])
    seg = _segments(observed, int(600.0 / setup.step_seconds))  # the detector's 10-minute gap
    # The probability is about the series' own level (the detector's centered mean of scrapes), so
    # that is what calibration and precision judge; the generator's noise-free level only says when a
    # rise series crossed (recall, lead) and which series are healthy.
    seen_level = centered_level(y, setup.level_points)[0]
    start = np.maximum(idx - setup.window_points + 1, seg)
    decide = observed & (idx - start + 1 >= MIN_HISTORY_POINTS)
    t = s.timestamps
    incident = None if s.incident_start is None else int(np.searchsorted(t, s.incident_start))
    crossing = None if s.crossing_time is None else int(np.searchsorted(t, s.crossing_time))
    rate = None
    if s.rate is not None:  # scraped with the latency: missed where it is, interpolated the same way
        rate = np.interp(idx, idx[observed], np.asarray(s.rate, dtype=np.float64)[observed])
    return Stream(s.name, "library", s.shape, s.kind, setup.step_seconds, y, seen_level, LINE_MS, decide, start,
                  seg, t, t[observed], s.values[observed], incident, crossing, rate)


def stream_nab(s: NabSeries) -> tuple[Stream, Setup]:
    """Cleaned, on the median step, decisions after NAB's probationary period."""
    ts, vs = clean_history(s.timestamps, s.values, float(s.timestamps.max()), np.inf)
    step = infer_step(ts)
    grid = ts[0] + step * np.arange(int((ts[-1] - ts[0]) // step) + 1)
    y = np.interp(grid, ts, vs)
    setup = setup_for("nab", step)
    prob_t = ts[min(int(0.15 * s.timestamps.size), 750)]
    p_end = int(np.searchsorted(grid, prob_t))
    idx = np.arange(y.size)
    start = np.maximum(idx - setup.window_points + 1, 0)
    decide = (idx >= p_end) & (idx - start + 1 >= MIN_HISTORY_POINTS) & (idx < y.size - 1)
    thr = float(np.percentile(y[:p_end], THRESHOLD_QUANTILE))
    name = s.name.split("/")[-1].removesuffix(".csv")
    return Stream(name, "nab", "nab", "nab", step, y, y, thr, decide, start, np.zeros(y.size, np.intp), grid,
                  ts, vs), setup


def windows_at(y: FLOAT, origins: NDArray[np.intp], starts: NDArray[np.intp], width: int) -> FLOAT:
    """Rows ``y[start..origin]``, right-aligned in `width` columns, NaN-padded on the left."""
    padded = np.concatenate([np.full(width - 1, np.nan), y])
    rows = sliding_window_view(padded, width)[origins].copy()
    cut = (origins - starts + 1)[:, None]
    rows[np.arange(width)[None, :] < width - cut] = np.nan
    return rows


@dataclass
class StreamResult:
    """What scoring needs of one series: where it decided, what it forecast, what happened."""

    name: str
    dataset: str
    shape: str
    kind: str
    step: float
    threshold: float
    decide: NDArray[np.bool_]  # decided, with the level still under the line
    outcome: NDArray[np.bool_]  # the level reached the line within the horizon after this step
    horizon: int
    rise_crossings: NDArray[np.intp]  # NAB: rise crossings; library rise: the crossing
    all_crossings: int
    incident: int | None
    crossing: int | None
    probability: dict[str, FLOAT] = field(default_factory=dict)
    median_step: dict[str, FLOAT] = field(default_factory=dict)
    rule: dict[str, FLOAT] = field(default_factory=dict)
    seconds: float = 0.0


def _outcome(truth: FLOAT, threshold: float, horizon: int) -> NDArray[np.bool_]:
    over = truth >= threshold
    ahead = np.zeros(truth.size, dtype=bool)
    for d in range(1, horizon + 1):
        ahead[:-d] |= over[d:]
    return ahead


def _crossings(st: Stream) -> tuple[NDArray[np.intp], int]:
    if st.dataset == "library":
        return (np.array([st.crossing], dtype=np.intp) if st.crossing is not None else np.array([], np.intp)), int(
            st.crossing is not None)
    y, thr = st.y, st.threshold
    first = int(np.argmax(st.decide)) if st.decide.any() else y.size
    c = np.nonzero((y[1:] >= thr) & (y[:-1] < thr))[0] + 1
    c = c[c > first]
    rising = np.array([bool(np.all(np.diff(y[i - RISE_STEPS : i + 1]) > 0)) for i in c], dtype=bool)
    return c[rising] if c.size else c, int(c.size)


def evaluate_stream(st: Stream, setup: Setup, models: Sequence[str]) -> StreamResult:
    """Every model's decisions on one series."""
    t0 = time.process_time()
    h, pts = setup.horizon_steps, setup.level_points
    origins = np.nonzero(st.decide)[0]
    # Under the line now: the trailing level (the mean of the last `pts` scrapes) is below it.
    trailing = np.convolve(st.y, np.ones(pts) / pts, mode="full")[: st.y.size]
    trailing[: pts - 1] = st.y[: pts - 1]
    origins = origins[trailing[origins] < st.threshold]
    decide = np.zeros(st.y.size, dtype=bool)
    decide[origins] = True
    rise, total = _crossings(st)
    res = StreamResult(st.name, st.dataset, st.shape, st.kind, st.step, st.threshold, decide,
                       _outcome(st.truth, st.threshold, h), h, rise, total, st.incident, st.crossing)
    starts = st.start[origins]
    weights_cache: dict[int, FLOAT] = {}

    def probability_of(point: FLOAT, errors: FLOAT, windows: FLOAT | None = None,
                       local: FLOAT | None = None) -> tuple[FLOAT, FLOAT]:
        """The detector's probability: recency weights times each row's level weights (measured on
        `windows`, the paths' series, unless given)."""
        k = errors.shape[1]
        if local is None:
            assert windows is not None
            local = level_weights(windows, k, h, pts)
        w = weights_cache.setdefault(k, recency_weights(k, setup.half_life_paths))[None, :] * local
        p, med, _ = first_passage_batch(point, errors, setup.relative, st.threshold, "above", h, w)
        return p, med

    for model in models:
        if model in RULES:
            width = max(2, int(round(RULES[model] / st.step)))
            out = np.full(st.y.size, np.nan)
            for lo in range(0, origins.size, CHUNK * 4):
                o = origins[lo : lo + CHUNK * 4]
                out[o] = predict_linear_rule(windows_at(st.y, o, st.start[o], width), setup, width)
            res.rule[model] = out.astype(np.float32)
            continue
        prob = np.full(st.y.size, np.nan)
        med = np.full(st.y.size, np.nan)
        if model == "naive":
            for lo in range(0, origins.size, CHUNK):
                o = origins[lo : lo + CHUNK]
                w = windows_at(st.y, o, starts[lo : lo + CHUNK], setup.window_points)
                prob[o], med[o] = probability_of(*naive_paths(w, setup), w)
        elif model == "holt" and st.rate is not None:
            _holt_load_stream(st, setup, origins, prob, med, probability_of)
        elif model == "holt":
            refit = _refit_origins(origins, st.segment, setup.holt_refit_steps)
            uniq, inverse = np.unique(refit, return_inverse=True)
            fitted = [holt_params(windows_at(st.y, uniq[lo : lo + CHUNK], st.start[uniq[lo : lo + CHUNK]],
                                             setup.window_points), setup) for lo in range(0, uniq.size, CHUNK)]
            params = HoltParams.stack(fitted) if fitted else None
            for lo in range(0, origins.size, CHUNK):
                o = origins[lo : lo + CHUNK]
                w = windows_at(st.y, o, starts[lo : lo + CHUNK], setup.window_points)
                assert params is not None
                sel = inverse[lo : lo + CHUNK]
                p = HoltParams(params.alpha[sel], params.beta[sel], params.phi[sel])
                prob[o], med[o] = probability_of(*holt_model_paths(w, p, setup), w)
        elif model == "prophet":
            _prophet_stream(st, setup, origins, prob, med, probability_of)
        else:
            raise ValueError(f"unknown model {model!r}")
        res.probability[model] = prob.astype(np.float32)
        res.median_step[model] = med.astype(np.float32)
    res.seconds = time.process_time() - t0
    return res


def _holt_load_stream(st: Stream, setup: Setup, origins: NDArray[np.intp], prob: FLOAT, med: FLOAT,
                      probability_of: Any) -> None:
    """Holt beside the request rate, as the detector runs it with a companion rate: the primary and
    rate parameters refitted on the same slots, the knee read at every decision."""
    assert st.rate is not None
    refit = _refit_origins(origins, st.segment, setup.holt_refit_steps)
    uniq, inverse = np.unique(refit, return_inverse=True)
    prim: list[HoltParams] = []
    rate: list[HoltParams] = []
    for lo in range(0, uniq.size, CHUNK):
        u = uniq[lo : lo + CHUNK]
        p, r = holt_load_params(windows_at(st.y, u, st.start[u], setup.window_points),
                                windows_at(st.rate, u, st.start[u], setup.window_points), setup)
        prim.append(p)
        nan = np.full(u.size, np.nan)
        rate.append(r if r is not None else HoltParams(nan, nan, nan))
    params, rate_params = HoltParams.stack(prim), HoltParams.stack(rate)
    for lo in range(0, origins.size, CHUNK):
        o = origins[lo : lo + CHUNK]
        w = windows_at(st.y, o, st.start[o], setup.window_points)
        rw = windows_at(st.rate, o, st.start[o], setup.window_points)
        sel = inverse[lo : lo + CHUNK]
        prob[o], med[o] = probability_of(*holt_load_model_paths(w, rw, params.take(sel), rate_params.take(sel),
                                                                setup, st.threshold), w)


def _refit_origins(origins: NDArray[np.intp], segment: NDArray[np.intp], every: int) -> NDArray[np.intp]:
    """Per decision, the decision at which its parameters were last fitted: every `every` decisions
    of a history segment, and at its first (a break in the history refits at once)."""
    out = np.empty_like(origins)
    last, last_seg = -1, -1
    count = 0
    for i, o in enumerate(origins):
        seg = int(segment[o])
        if seg != last_seg or count % max(every, 1) == 0:
            last, count = int(o), 0
            last_seg = seg
        out[i] = last
        count += 1
    return out


def _prophet_stream(st: Stream, setup: Setup, origins: NDArray[np.intp], prob: FLOAT, med: FLOAT,
                    probability_of: Any) -> None:
    """Prophet as the detector runs it: a warm-started refit every `prophet_refit_steps`, the cached
    curve anchored on the latest actuals in between; calibrated on the errors against that curve."""
    times = st.times
    h = setup.horizon_steps
    curve: FLOAT | None = None
    init: object | None = None
    fit_at = -10**9
    failed: list[str] = []
    points: list[FLOAT] = []
    errors: list[FLOAT] = []
    locals_: list[FLOAT] = []
    where: list[int] = []

    def flush() -> None:
        if not where:
            return
        k = max(e.shape[0] for e in errors)
        stacked = np.full((len(errors), k, h), np.nan)
        local = np.ones((len(errors), k))
        for i, e in enumerate(errors):
            stacked[i, k - e.shape[0] :] = e  # newest paths last, as the weights assume
            local[i, k - e.shape[0] :] = locals_[i]
        p, m = probability_of(np.stack(points), stacked, local=local)
        prob[where], med[where] = p, m
        for kept in (points, errors, locals_):
            kept.clear()
        where.clear()

    for o in origins:
        if curve is None or o - fit_at >= setup.prophet_refit_steps or st.segment[o] > fit_at:
            try:
                curve, init = prophet_curve(st.ts, st.vs, times, int(o), setup, init)
            except Exception as exc:  # a failed fit keeps the previous curve, as the detector does
                failed.append(f"{type(exc).__name__}: {exc}")
                if curve is None:
                    continue
            fit_at = int(o)
        s = int(st.start[o])
        seg = curve[s : o + 1 + h]
        if seg.size < o + 1 + h - s or not np.isfinite(seg[-h:]).all():
            continue
        point, err, weight = prophet_model_paths(st.y[s : o + 1], seg, setup)
        points.append(point)
        errors.append(err)
        locals_.append(weight)
        where.append(int(o))
        if len(where) >= CHUNK:
            flush()
    flush()
    if failed:  # recorded, not swallowed: the column is only as good as its fits
        print(f"prophet: {len(failed)} fits failed on {st.name} (first: {failed[0]})", file=sys.stderr)


# Scoring ------------------------------------------------------------------------------------------


def fires(r: StreamResult, model: str, knob: float, min_lead_seconds: float) -> NDArray[np.bool_]:
    """Where the model fires at this knob (probability, or predict_linear's margin)."""
    if model in r.rule:
        return r.decide & (np.nan_to_num(r.rule[model], nan=-np.inf) >= r.threshold + knob * abs(r.threshold))
    p = np.nan_to_num(r.probability[model], nan=0.0)
    lead_ok = np.nan_to_num(r.median_step[model], nan=0.0) * r.step >= min_lead_seconds
    return r.decide & (p >= knob) & lead_ok


@dataclass
class Score:
    """Counts over a dataset at one knob."""

    episodes: int = 0
    hits: int = 0
    first_hits: int = 0  # episodes whose first fire is followed by the level at the line within the horizon
    crossings: int = 0  # rise crossings (NAB) / rise series (library)
    predicted: int = 0
    leads_min: list[float] = field(default_factory=list)
    false_episodes: int = 0
    healthy_seen: int = 0  # library: healthy series' fires followed by the series' own level at the line
    healthy_days: float = 0.0
    by_shape: dict[str, list[float | None]] = field(default_factory=dict)  # library: lead per rise series

    @property
    def precision(self) -> float:
        return self.hits / self.episodes if self.episodes else float("nan")

    @property
    def first_fire_precision(self) -> float:
        return self.first_hits / self.episodes if self.episodes else float("nan")

    @property
    def recall(self) -> float:
        return self.predicted / self.crossings if self.crossings else float("nan")

    @property
    def median_lead(self) -> float:
        return float(np.median(self.leads_min)) if self.leads_min else float("nan")

    @property
    def false_per_day(self) -> float:
        return self.false_episodes / self.healthy_days if self.healthy_days else float("nan")


def score(results: Iterable[StreamResult], model: str, knob: float,
          min_lead_seconds: float = DEFAULT_MIN_LEAD_SECONDS) -> Score:
    sc = Score()
    for r in results:
        f = fires(r, model, knob, min_lead_seconds)
        idx = np.nonzero(f)[0]
        begins = np.r_[True, np.diff(idx) > r.horizon] if idx.size else np.zeros(0, dtype=bool)  # an episode's first fire
        ep_id = np.cumsum(begins)
        hit_ep = np.unique(ep_id[r.outcome[idx]]) if idx.size else np.array([], int)
        n_ep = int(ep_id[-1]) if idx.size else 0
        starts = idx[begins]
        sc.episodes += n_ep
        sc.hits += int(hit_ep.size)
        sc.first_hits += int(r.outcome[starts].sum())
        span = np.nonzero(r.decide)[0]
        days = float((span[-1] - span[0] + 1) * r.step / 86400.0) if span.size else 0.0
        if r.dataset == "nab":
            sc.false_episodes += n_ep - int(hit_ep.size)
            sc.healthy_days += days
            for c in r.rise_crossings:
                look = idx[(idx >= c - r.horizon) & (idx < c)]
                sc.crossings += 1
                if look.size:
                    sc.predicted += 1
                    sc.leads_min.append(float((c - look[0]) * r.step / 60.0))
            continue
        if r.kind == "healthy":
            sc.false_episodes += int(starts.size)
            sc.healthy_seen += int(hit_ep.size)
            sc.healthy_days += days
            continue
        assert r.incident is not None and r.crossing is not None
        sc.false_episodes += int((starts < r.incident).sum())
        sc.healthy_days += float(max(0, r.incident - (span[0] if span.size else r.incident)) * r.step / 86400.0)
        before = idx[(idx >= r.incident) & (idx < r.crossing)]
        sc.crossings += 1
        lead = float((r.crossing - before[0]) * r.step / 60.0) if before.size else None
        if lead is not None:
            sc.predicted += 1
            sc.leads_min.append(lead)
        sc.by_shape.setdefault(r.shape, []).append(lead)
    return sc


def reliability(results: Sequence[StreamResult], model: str) -> tuple[list[tuple[float, float, float, int]], float]:
    """(bin low, mean predicted, observed frequency, steps) per bin, and the Brier skill score
    against each series' own base rate."""
    ps, os, base = [], [], []
    for r in results:
        p = r.probability[model]
        ok = r.decide & np.isfinite(p)
        if not ok.any():
            continue
        o = r.outcome[ok].astype(float)
        ps.append(p[ok].astype(float))
        os.append(o)
        base.append(np.full(o.size, o.mean()))
    if not ps:
        return [], float("nan")
    p_all, o_all, b_all = np.concatenate(ps), np.concatenate(os), np.concatenate(base)
    rows = []
    which = np.clip(np.digitize(p_all, RELIABILITY_BINS) - 1, 0, RELIABILITY_BINS.size - 2)
    for b in range(RELIABILITY_BINS.size - 1):
        m = which == b
        if m.any():
            rows.append((float(RELIABILITY_BINS[b]), float(p_all[m].mean()), float(o_all[m].mean()), int(m.sum())))
    bs, ref = float(np.mean((p_all - o_all) ** 2)), float(np.mean((b_all - o_all) ** 2))
    return rows, 1.0 - bs / ref if ref > 0 else float("nan")


CALIBRATION_TOLERANCE = 0.1
"""The calibration bar: a bin's observed frequency within this of its mean prediction..."""
MIN_BIN_STEPS = 100
"""...in every bin with at least this many steps."""


def bins_off(rows: Sequence[tuple[float, float, float, int]]) -> tuple[int, int]:
    """Of `reliability`'s rows, how many the calibration bar judges, and how many of those miss it."""
    judged = [r for r in rows if r[3] >= MIN_BIN_STEPS]
    return sum(abs(r[1] - r[2]) > CALIBRATION_TOLERANCE for r in judged), len(judged)


def knobs_for(model: str) -> tuple[float, ...]:
    return MARGIN_KNOBS if model in RULES else PROB_KNOBS


def recall_at_precision(results: Sequence[StreamResult], model: str, target: float) -> tuple[float, float | None]:
    """The highest recall over the model's knob among points with precision >= target (and that knob)."""
    best, at = 0.0, None
    for k in knobs_for(model):
        sc = score(results, model, k)
        if sc.episodes and sc.precision >= target and sc.recall > best:
            best, at = sc.recall, k
    return best, at


def poisson_interval(k: int, exposure: float) -> tuple[float, float]:
    """Exact (Garwood) 95% interval of a Poisson rate."""
    from scipy.stats import chi2

    lo = 0.0 if k == 0 else float(chi2.ppf(0.025, 2 * k)) / 2.0
    hi = float(chi2.ppf(0.975, 2 * k + 2)) / 2.0
    return lo / exposure, hi / exposure


# Rendering ----------------------------------------------------------------------------------------


def _f(x: float, nd: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{nd}f}"


def render_dataset(results: Sequence[StreamResult], dataset: str, models: Sequence[str]) -> list[str]:
    rs = [r for r in results if r.dataset == dataset]
    if not rs:
        return []
    out = [f"## {dataset}", ""]
    h = rs[0].horizon
    if dataset == "nab":
        days = sum(score([r], models[0], knobs_for(models[0])[0]).healthy_days for r in rs)
        out += [f"{len(rs)} series, {days:.0f} series-days of decisions, horizon {h} steps, "
                f"{sum(r.all_crossings for r in rs)} crossings of which "
                f"{sum(r.rise_crossings.size for r in rs)} rise crossings.", ""]
    else:
        rise = [r for r in rs if r.kind == "rise"]
        out += [f"{len(rs)} series ({len(rise)} rise), horizon {h} steps of {rs[0].step:.0f} s, line {LINE_MS:g} ms.", ""]
    default_knob = {m: (DEFAULT_MIN_PROBABILITY if m not in RULES else 0.0) for m in models}
    out += ["### At the default knob (min_probability 0.9, min lead 60 s; predict_linear: margin 0)", "",
            "| model | knob | fire episodes | precision | precision at the first fire | recall | median lead (min) "
            "| false fires / healthy series-day | 95% interval |",
            "|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        sc = score(rs, m, default_knob[m])
        lo, hi = poisson_interval(sc.false_episodes, sc.healthy_days) if sc.healthy_days else (float("nan"),) * 2
        out.append(f"| {m} | {default_knob[m]:g} | {sc.episodes} | {_f(sc.precision)} | {_f(sc.first_fire_precision)} "
                   f"| {sc.predicted}/{sc.crossings} "
                   f"({_f(sc.recall)}) | {_f(sc.median_lead, 1)} | {sc.false_episodes} / {sc.healthy_days:.1f} = "
                   f"{_f(sc.false_per_day, 4)} | {_f(lo, 4)}-{_f(hi, 4)} |")
    out += ["", "### Recall at matched precision (the best knob reaching the precision)", "",
            "| model | P >= 0.7 | P >= 0.8 | P >= 0.9 |", "|---|---|---|---|"]
    for m in models:
        cells = []
        for target in (0.7, 0.8, 0.9):
            rec, at = recall_at_precision(rs, m, target)
            cells.append(f"{rec:.3f} (knob {at:g})" if at is not None else "0 (none)")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    out += ["", "### Precision-recall over each model's knob", "",
            "| model | knob | episodes | precision | recall | median lead (min) | false fires / series-day |",
            "|---|---|---|---|---|---|---|"]
    for m in models:
        for k in knobs_for(m):
            sc = score(rs, m, k)
            out.append(f"| {m} | {k:g} | {sc.episodes} | {_f(sc.precision)} | {_f(sc.recall)} | "
                       f"{_f(sc.median_lead, 1)} | {_f(sc.false_per_day, 4)} |")
    for m in (x for x in models if x in CALIBRATED):
        rows, bss = reliability(rs, m)
        out += ["", f"### Reliability: {m} (every decision step; outcome: the level at the line within the horizon)", "",
                "| bin | mean predicted | observed | steps | within 0.1 |", "|---|---|---|---|---|"]
        for lo, mp, ob, n in rows:
            ok = "yes" if abs(mp - ob) <= CALIBRATION_TOLERANCE else ("NO" if n >= MIN_BIN_STEPS else "(n < 100)")
            out.append(f"| {lo:.1f}-{lo + 0.1:.1f} | {mp:.3f} | {ob:.3f} | {n} | {ok} |")
        out.append(f"\nBrier skill score against each series' base rate: {bss:.3f}")
    if dataset == "library":
        out += ["", "### Library by shape at the default knob", "",
                "| model | " + " | ".join(sorted({r.shape for r in rs if r.kind == 'rise'})) + " |",
                "|---|" + "---|" * len({r.shape for r in rs if r.kind == 'rise'})]
        for m in models:
            sc = score(rs, m, default_knob[m])
            cells = []
            for shape in sorted(sc.by_shape):
                leads = [x for x in sc.by_shape[shape] if x is not None]
                cells.append(f"{len(leads)}/{len(sc.by_shape[shape])}, {_f(float(np.median(leads)) if leads else float('nan'), 1)} min")
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out += ["", "| model | " + " | ".join(sorted({r.shape for r in rs if r.kind == 'healthy'})) + " |",
                "|---|" + "---|" * len({r.shape for r in rs if r.kind == 'healthy'})]
        for m in models:
            cells = []
            for shape in sorted({r.shape for r in rs if r.kind == "healthy"}):
                sc = score([r for r in rs if r.shape == shape], m, default_knob[m])
                cells.append(f"{sc.false_episodes} / {sc.healthy_days:.0f} d")
            out.append(f"| {m} | " + " | ".join(cells) + " |")
    return out


def bars(results: Sequence[StreamResult], model: str = DEFAULT_MODEL,
         knob: float = DEFAULT_MIN_PROBABILITY) -> list[str]:
    """The issue's bars for the default forecaster, each with its number."""
    out = ["## Bars (default: " + f"{model}, min_probability {knob:g}, min lead {DEFAULT_MIN_LEAD_SECONDS:g} s)", ""]
    lib = [r for r in results if r.dataset == "library"]
    nab = [r for r in results if r.dataset == "nab"]

    def line(ok: bool, text: str) -> str:
        return f"- [{'x' if ok else ' '}] {text}"

    if lib and model in lib[0].probability:
        sc = score(lib, model, knob)
        out.append(line(sc.recall >= 0.9, f"library: rise series signalled before the crossing {sc.predicted}/"
                                          f"{sc.crossings} = {sc.recall:.3f} (bar 0.90)"))
        out.append(line(sc.median_lead >= 5, f"library: median lead {sc.median_lead:.1f} min (bar 5)"))
        lo, _ = poisson_interval(sc.false_episodes, sc.healthy_days)
        out.append(line(lo <= 1 / 30 and sc.false_per_day <= 1.2 / 30,
                        f"library healthy: {sc.false_episodes} false fires in {sc.healthy_days:.1f} series-days = "
                        f"{sc.false_per_day * 30:.2f} per 30 days (95% lower bound {lo * 30:.2f}; bar: lower bound <= 1, "
                        f"estimate <= 1.2); {sc.healthy_seen} of them followed by the series' own level at the line"))
        rows, bss = reliability(lib, model)
        off, judged = bins_off(rows)
        out.append(line(not off and bss > 0, f"library calibration: {off} bins off by more than 0.1 "
                                             f"(of {judged} with >= 100 steps); BSS {bss:.3f}"))
    if nab and model in nab[0].probability:
        rules = [rule for rule in RULES if rule in nab[0].rule]
        for target in (0.7, 0.8, 0.9):
            mine, _ = recall_at_precision(nab, model, target)
            if not rules:  # a run without the predict_linear columns has nothing to compare with
                out.append(f"- [?] NAB at precision {target}: recall {mine:.3f}; predict_linear not run")
                continue
            theirs = max(recall_at_precision(nab, rule, target)[0] for rule in rules)
            out.append(line(mine >= theirs, f"NAB at precision {target}: recall {mine:.3f} vs predict_linear's best "
                                            f"{theirs:.3f}"))
        sc = score(nab, model, knob)
        out.append(line(sc.precision >= 0.85, f"NAB at the default: precision {sc.hits}/{sc.episodes} = {sc.precision:.3f} (bar 0.85; "
                                                f"{sc.first_hits}/{sc.episodes} at the episodes' first fires)"))
        out.append(line(sc.recall >= 0.3, f"NAB at the default: rise crossings predicted >= 1 step ahead "
                                          f"{sc.predicted}/{sc.crossings} = {sc.recall:.3f} (bar 0.30)"))
        rows, bss = reliability(nab, model)
        off, judged = bins_off(rows)
        out.append(line(not off and bss > 0, f"NAB calibration: {off} bins off by more than 0.1 "
                                             f"(of {judged} with >= 100 steps); BSS {bss:.3f}"))
    return out


# Driver -------------------------------------------------------------------------------------------


def _run_nab(s: NabSeries, models: Sequence[str]) -> StreamResult:
    st, setup = stream_nab(s)
    return evaluate_stream(st, setup, models)


def _run_library(s: forecast_library.LibrarySeries, models: Sequence[str]) -> StreamResult:
    setup = setup_for("library", forecast_library.STEP_SECONDS)
    return evaluate_stream(stream_library(s, setup), setup, models)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="nab,library")
    ap.add_argument("--models", default="naive,predict_linear_30m,predict_linear_60m,holt,prophet")
    ap.add_argument("--library-models", default=None, help="models for the library (default: --models)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=forecast_library.SEEDS, help="library seeds per shape")
    ap.add_argument("--fresh-seeds", default="", metavar="FROM:TO",
                    help="score library seeds FROM..TO-1 generated in memory instead of the committed ones "
                         "(a check that nothing is tuned to the committed seeds)")
    ap.add_argument("--shapes", default="", help="comma-separated library shapes (default: all)")
    ap.add_argument("--only", default="", help="substring filter on NAB series names")
    ap.add_argument("--save", type=Path, default=None, help="pickle the per-series results here")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    lib_models = [m for m in (args.library_models or args.models).split(",") if m]
    jobs: list[tuple[Any, Any, Sequence[str]]] = []
    if "nab" in args.datasets:
        nab = sorted((s for s in load_series() if args.only in s.name), key=lambda s: -s.timestamps.size)
        jobs += [(_run_nab, s, models) for s in nab]
    if "library" in args.datasets:
        shapes = set(args.shapes.split(",")) if args.shapes else None
        if args.fresh_seeds:
            lo, hi = (int(x) for x in args.fresh_seeds.split(":"))
            lib = [forecast_library.generate(shape, seed) for shape in forecast_library.SHAPES
                   if shapes is None or shape in shapes for seed in range(lo, hi)]
        else:
            lib = [s for s in forecast_library.load(shapes=shapes) if int(s.name.split("/")[1]) < args.seeds]
        jobs += [(_run_library, s, lib_models) for s in lib]
    wall = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(fn, s, m) for fn, s, m in jobs]
        results = [f.result() for f in futures]
    if args.save:
        import pickle

        args.save.write_bytes(pickle.dumps(results))
    lines: list[str] = []
    for dataset, ms in (("nab", models), ("library", lib_models)):
        lines += render_dataset(results, dataset, ms) + [""]
    lines += bars(results)
    print("\n".join(lines))
    print(f"\n(wall {time.perf_counter() - wall:.0f}s, {args.workers} workers, worker CPU "
          f"{sum(r.seconds for r in results):.0f}s excluding Stan child processes)")
    return 0


if __name__ == "__main__":
    # Run the imported module's main, so --save pickles evaluation.forecast_eval.StreamResult, which
    # another process can load, not __main__.StreamResult.
    from evaluation import forecast_eval

    sys.exit(forecast_eval.main())
