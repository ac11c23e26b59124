"""Forecast evaluation on the NAB development series: MASE (naive, Holt, Prophet) and lead time.

Run: ``python -m evaluation.forecast_eval [--origins 20] [--workers 2]``; prints markdown tables.
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from detectors.forecast import anchor_offset, clean_history, fit_holt, fit_prophet_forecast, holt_forecast, infer_step
from evaluation.nab_data import NabSeries, load_series

H_STEPS = 3  # forecast horizon: 3 of the series' own steps (15 min at 5 min, 90 min for nyc_taxi)
HOLT_POINTS = 360  # the detector's default holt_fit_points
PROPHET_LOOKBACK_S = 7 * 86400.0
THRESHOLD_QUANTILE = 99.0  # one rule for every series: P99 of the probationary values, "above"
_CHUNK = 2048


@dataclass
class SeriesResult:
    name: str
    step_s: float
    n_origins: int
    mase: dict[str, float]
    threshold: float
    windows: int
    detected: dict[str, int]  # windows with a fire inside them, per method
    lead_over_reactive_min: list[float]  # holt: reactive first fire minus forecast first fire
    crossings: int  # actual up-crossings of the threshold after probation
    predicted: dict[str, int]  # crossings with a forecast fire in the H steps before them
    lead_before_crossing_min: dict[str, list[float]]
    false_alarms: dict[str, int]  # fire episodes outside every labeled window
    episodes_total: dict[str, int]  # forecast fire episodes (fires <= h steps apart)
    episodes_hit: dict[str, int]  # ... in which the actual value crossed within h steps of a fire
    days: float
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def regular_grid(s: NabSeries) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Cleaned raw points and the series linearly interpolated onto its median step (realTraffic
    is irregular; the DST duplicates and the one backwards stamp are dropped by cleaning)."""
    ts, vs = clean_history(s.timestamps, s.values, float(s.timestamps.max()), np.inf)
    step = infer_step(ts)
    grid = ts[0] + step * np.arange(int((ts[-1] - ts[0]) // step) + 1)
    return ts, vs, grid, np.interp(grid, ts, vs), step


def episodes(fired_idx: np.ndarray, gap: int) -> np.ndarray:
    """Start indices of runs of fires separated by more than ``gap`` steps."""
    if not fired_idx.size:
        return fired_idx
    starts = np.r_[True, np.diff(fired_idx) > gap]
    return fired_idx[starts]


def holt_paths(y: np.ndarray, idx: np.ndarray, width: int, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Holt point forecasts and standard errors h steps ahead from every origin in ``idx``,
    fitted on the ``width`` points ending there (batched: the same functions the detector uses)."""
    wins = sliding_window_view(y, width)
    points, ses, flat = [], [], []
    for lo in range(0, idx.size, _CHUNK):
        rows = wins[idx[lo : lo + _CHUNK] - width + 1]
        p, se = holt_forecast(fit_holt(rows), h)
        points.append(p)
        ses.append(se)
        flat.append(np.ptp(rows, axis=1) == 0)
    return np.concatenate(points), np.concatenate(ses), np.concatenate(flat)


def evaluate_series(s: NabSeries, n_origins: int, prophet_refit_steps: int) -> SeriesResult:
    t_start = time.process_time()
    ts, vs, grid, y, step = regular_grid(s)
    n = y.size
    prob_t = ts[min(int(0.15 * s.timestamps.size), 750)]
    p_end = int(np.searchsorted(grid, prob_t))
    width = min(HOLT_POINTS, p_end)
    h = H_STEPS
    notes: list[str] = []

    # --- MASE at h steps, rolling origins after the probationary period -------------------
    scale = float(np.mean(np.abs(np.diff(y[:p_end]))))  # in-sample one-step naive MAE
    origins = np.unique(np.linspace(max(p_end, width - 1), n - 1 - h, n_origins).astype(int))
    truth = y[origins + h]
    err = {"naive": np.abs(truth - y[origins])}
    hp, _, _ = holt_paths(y, origins, width, h)
    err["holt"] = np.abs(truth - hp[:, h - 1])
    prev = None
    pe = []
    for o in origins:
        keep = (ts <= grid[o]) & (ts > grid[o] - PROPHET_LOOKBACK_S)
        f = fit_prophet_forecast(ts[keep], vs[keep], ahead_seconds=h * step, step_seconds=step,
                                 init=prev.init if prev else None)
        prev = f
        pe.append(abs(truth[len(pe)] - float(np.interp(grid[o + h], f.times, f.yhat))))
    err["prophet"] = np.array(pe)
    mase = {k: float(np.mean(v) / scale) if scale > 0 else float("nan") for k, v in err.items()}

    # --- lead time: stream every step after probation, threshold from probation only -------
    thr = float(np.percentile(y[:p_end], THRESHOLD_QUANTILE))
    idx = np.arange(max(p_end, width - 1), n - 1)
    below = y[idx] < thr
    point, se, flat = holt_paths(y, idx, width, h)
    z = NormalDist().inv_cdf(0.9)  # interval_width 0.8, the detector's default
    fired = {
        "holt": below & ~flat & np.any(point >= thr, axis=1),
        "holt_upper": below & ~flat & np.any(point + z * se >= thr, axis=1),
    }
    # Prophet as the detector runs it: refit every `prophet_refit_steps`, warm-started, and
    # between refits the cached curve shifted to the latest actuals (anchor_offset).
    pf = np.zeros(idx.size, dtype=bool)
    f = None
    for j, i in enumerate(idx):
        if f is None or (i - idx[0]) % prophet_refit_steps == 0:
            keep = (ts <= grid[i]) & (ts > grid[i] - PROPHET_LOOKBACK_S)
            f = fit_prophet_forecast(ts[keep], vs[keep], step_seconds=step,
                                     ahead_seconds=(prophet_refit_steps + h) * step,
                                     init=f.init if f is not None else None)
        off = anchor_offset(grid[max(0, i - 4) : i + 1], y[max(0, i - 4) : i + 1], f.times, f.yhat)
        ahead = np.interp(grid[i] + step * np.arange(1, h + 1), f.times, f.yhat) + off
        pf[j] = below[j] and bool(np.any(ahead >= thr))
    fired["prophet"] = pf
    reactive = ~below

    in_window = np.zeros(idx.size, dtype=bool)
    detected = {k: 0 for k in [*fired, "reactive"]}
    lead_over = []
    for ws, we in s.windows:
        w = (grid[idx] >= ws) & (grid[idx] <= we)
        in_window |= w
        for k, f_arr in [*fired.items(), ("reactive", reactive)]:
            detected[k] += bool(np.any(f_arr & w))
        fh, fr = np.nonzero(fired["holt"] & w)[0], np.nonzero(reactive & w)[0]
        if fh.size and fr.size:
            lead_over.append(float((grid[idx[fr[0]]] - grid[idx[fh[0]]]) / 60.0))

    # Actual up-crossings (a run of values at/over the threshold starting) and whether a
    # forecast fired within the h steps before the run started.
    cross = idx[episodes(np.nonzero(reactive)[0], 0)] if reactive.any() else np.array([], int)
    cross = np.array([c for c in cross if c > idx[0] and y[c - 1] < thr], dtype=int)
    predicted = {k: 0 for k in fired}
    lead_before = {k: [] for k in fired}
    for c in cross:
        for k, f_arr in fired.items():
            look = (idx >= c - h) & (idx < c) & f_arr
            if look.any():
                predicted[k] += 1
                lead_before[k].append(float((grid[c] - grid[idx[np.nonzero(look)[0][0]]]) / 60.0))
    ep_total, ep_hit = {}, {}
    ahead_cross = np.zeros(idx.size, dtype=bool)  # the actual crosses within h steps after j
    for d in range(1, h + 1):
        ahead_cross[:-d] |= reactive[d:]
    for k, f_arr in fired.items():
        fi = np.nonzero(f_arr)[0]
        if not fi.size:
            ep_total[k] = ep_hit[k] = 0
            continue
        ep_id = np.cumsum(np.r_[True, np.diff(fi) > h])
        ep_total[k] = int(ep_id[-1])
        ep_hit[k] = int(np.unique(ep_id[ahead_cross[fi]]).size)
    fa = {k: int(episodes(np.nonzero(f_arr & ~in_window)[0], h).size)
          for k, f_arr in [*fired.items(), ("reactive", reactive)]}
    return SeriesResult(
        name=s.name.split("/")[-1].removesuffix(".csv"), step_s=step, n_origins=origins.size,
        mase=mase, threshold=thr, windows=len(s.windows), detected=detected,
        lead_over_reactive_min=lead_over, crossings=int(cross.size), predicted=predicted,
        lead_before_crossing_min=lead_before, false_alarms=fa,
        episodes_total=ep_total, episodes_hit=ep_hit,
        days=float((grid[idx[-1]] - grid[idx[0]]) / 86400.0),
        seconds=time.process_time() - t_start, notes=notes,
    )


def _fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}"


def render(results: list[SeriesResult]) -> str:
    """Two markdown tables: forecast error, and lead time / false alarms."""
    out = [f"### Forecast error: MASE at h = {H_STEPS} steps (lower is better; < 1 beats the "
           "in-sample one-step naive)", "",
           "| series | step | origins | naive | holt | prophet |", "|---|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r.name} | {r.step_s / 60:.0f}m | {r.n_origins} | {_fmt(r.mase['naive'])} | "
                   f"{_fmt(r.mase['holt'])} | {_fmt(r.mase['prophet'])} |")
    med = {k: float(np.nanmedian([r.mase[k] for r in results])) for k in ("naive", "holt", "prophet")}
    wins = {k: sum(r.mase[k] < r.mase["naive"] for r in results) for k in ("holt", "prophet")}
    out.append(f"| **median** | | | {_fmt(med['naive'])} | {_fmt(med['holt'])} | {_fmt(med['prophet'])} |")
    out += ["", f"Series where the model beats naive: holt {wins['holt']}/{len(results)}, "
            f"prophet {wins['prophet']}/{len(results)}.", ""]

    methods = ("holt", "holt_upper", "prophet")
    out += [f"### Lead time (threshold = P{THRESHOLD_QUANTILE:g} of the probationary 15%, "
            f"direction above, horizon {H_STEPS} steps)", "",
            "| series | thr | windows | detected holt / upper / prophet / reactive | "
            "holt lead over reactive in window (min) | crossings | predicted holt / upper / prophet | "
            "false-alarm episodes holt / upper / prophet / reactive | days |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lo = ", ".join(f"{x:.0f}" for x in r.lead_over_reactive_min) or "-"
        out.append(
            f"| {r.name} | {r.threshold:.4g} | {r.windows} | "
            + " / ".join(str(r.detected[k]) for k in (*methods, "reactive"))
            + f" | {lo} | {r.crossings} | " + " / ".join(str(r.predicted[k]) for k in methods)
            + " | " + " / ".join(str(r.false_alarms[k]) for k in (*methods, "reactive"))
            + f" | {r.days:.1f} |")
    tot_w = sum(r.windows for r in results)
    tot_c = sum(r.crossings for r in results)
    days = sum(r.days for r in results)
    lines = ["", f"Totals over {len(results)} series, {days:.0f} days after probation: "
             f"{tot_w} windows, {tot_c} actual threshold crossings."]
    for k in (*methods, "reactive"):
        det = sum(r.detected[k] for r in results)
        fa = sum(r.false_alarms[k] for r in results)
        line = f"- {k}: windows detected {det}/{tot_w}; false-alarm episodes {fa} ({fa / days:.2f}/day)"
        if k != "reactive":
            pred = sum(r.predicted[k] for r in results)
            leads = [x for r in results for x in r.lead_before_crossing_min[k]]
            et = sum(r.episodes_total[k] for r in results)
            eh = sum(r.episodes_hit[k] for r in results)
            line += (f"; crossings predicted up to {H_STEPS} steps ahead {pred}/{tot_c}"
                     + (f", median lead {np.median(leads):.0f} min" if leads else "")
                     + f"; fire episodes followed by a real crossing within the horizon {eh}/{et}")
        lines.append(line)
    lead_all = [x for r in results for x in r.lead_over_reactive_min]
    if lead_all:
        lines.append(f"- holt vs reactive inside windows where both fire: median "
                     f"{np.median(lead_all):.0f} min earlier (n={len(lead_all)}, "
                     f"{sum(x > 0 for x in lead_all)} earlier, {sum(x == 0 for x in lead_all)} same step)")
    return "\n".join(out + lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--origins", type=int, default=20, help="rolling origins per series for MASE")
    ap.add_argument("--prophet-refit-steps", type=int, default=96,
                    help="lead-time run: Prophet refits every this many steps (8h at 5 min)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="", help="substring filter on series names")
    args = ap.parse_args(argv)
    series = [s for s in load_series() if args.only in s.name]
    series.sort(key=lambda s: -s.timestamps.size)  # longest first balances the pool
    wall = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(evaluate_series, series, [args.origins] * len(series),
                                [args.prophet_refit_steps] * len(series)))
    results.sort(key=lambda r: r.name)
    print(render(results))
    print(f"\n(wall {time.perf_counter() - wall:.0f}s, {args.workers} workers, "
          f"worker CPU {sum(r.seconds for r in results):.0f}s excluding Stan child processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
