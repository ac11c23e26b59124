"""The pool job of one Holt cycle: refit the due rows, filter every row, and read every series'
outlook (probability, crossing, band) in batches of equally shaped windows, so `detect` only
looks it up. Module-level and picklable, like `holt_prepare`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from detectors.forecast.calibration import level_weights
from detectors.forecast.holt_paths import HoltBatch, HoltParams, holt_knee_paths, holt_paths, holt_prepare
from detectors.forecast.load_knee import KneeFit, knee_rows
from detectors.forecast.outlook import Outlook, outlook_batch
from detectors.forecast.scratch import Scratch

FLOAT = NDArray[np.float64]
INT = NDArray[np.intp]
ERROR_HALF_LIFE_PATHS = 1e9
"""Past error paths count equally (a half-life in origins would weight the recent past more)."""
CHUNK_ROWS = 32
"""Series per vectorised pass: a (rows, K, H) block stays in cache (about 4 MB at 360 points and a
60-step horizon) instead of the whole cycle's paths in memory at once."""


@dataclass(frozen=True)
class CycleRows:
    """Per row of the cycle's (NaN left-padded) windows, shape ``(N,)`` each: what its outlook
    needs beyond the window."""

    sizes: INT  # the window's own length (the rest of the row is padding)
    starts: FLOAT  # time of the window's last grid point, the forecast's origin
    steps: FLOAT  # the grid step, seconds
    horizons: INT  # forecast steps from the origin to now + horizon
    points: INT  # the level's window, scrapes


@dataclass(frozen=True)
class Question:
    """What every outlook of the cycle asks: the line, its side, how errors carry over."""

    threshold: float
    direction: str
    relative: bool


@dataclass(frozen=True)
class HoltCycle:
    """The job's result: each row's parameters (refitted or kept) and outlook, and the log rates'
    parameters where a row has a rate (NaN elsewhere; None without any rate); the states stay in
    the pool (the outlooks are all `detect` needs of them)."""

    params: HoltParams
    outlooks: list[Outlook]
    rate_params: HoltParams | None = None


@dataclass(frozen=True)
class Rates:
    """The request rate beside each row's latency (the capacity knee, detectors/forecast/load_knee.py):
    ``values`` on the rows' grids (NaN where a row has none), and the log rates' kept parameters
    (NaN where none is kept: refitted)."""

    values: FLOAT
    params: HoltParams


def holt_cycle(windows: FLOAT, refit: NDArray[np.bool_], alpha: FLOAT, beta: FLOAT, phi: FLOAT,
               rows: CycleRows, question: Question, rates: Rates | None = None) -> HoltCycle:
    """`holt_prepare`, then the outlook of every row, as the one-series path in `HoltForecaster.forecast`
    would compute it from that row's trimmed states. A row whose rate explains its latency (a usable
    knee) is forecast through the knee: its primary row is the latency the rate does not explain,
    and its log rate is filtered beside it (refitted with it, or when no parameters are kept)."""
    primary, log_r, knee = knee_rows(windows, rates.values if rates is not None else None)
    batch = holt_prepare(primary, rows.steps, refit, alpha, beta, phi)
    rate_batch, rate_params = _rate_states(log_r, rows.steps, refit, rates)
    use = knee.usable & np.isfinite(rate_params.alpha) if rate_params is not None else knee.usable & False
    width = windows.shape[1]
    found: dict[int, Outlook] = {}
    scratch = Scratch()  # the chunks' work arrays, allocated once
    shapes = {*zip(rows.sizes.tolist(), rows.horizons.tolist(), rows.points.tolist(), use.tolist())}
    for size, horizon, points, through_knee in sorted(shapes):
        same = np.flatnonzero((rows.sizes == size) & (rows.horizons == horizon) & (rows.points == points)
                              & (use == through_knee))
        for lo in range(0, same.size, CHUNK_ROWS):
            idx = same[lo : lo + CHUNK_ROWS]
            cut = slice(width - size, width)
            sub = HoltBatch(batch.params.take(idx), batch.levels[idx, cut], batch.trends[idx, cut])
            values = windows[idx, cut]
            if through_knee:
                assert rate_batch is not None
                sub_rate = HoltBatch(rate_batch.params.take(idx), rate_batch.levels[idx, cut],
                                     rate_batch.trends[idx, cut])
                point, errors = holt_knee_paths(sub, sub_rate, knee.take(idx), values, horizon, points,
                                                question.relative, question.threshold)
            else:
                point, errors = holt_paths(sub, values, horizon, points, question.relative, scratch)
            infos = [_info(sub.params, j, float(rows.steps[i]), points, knee, int(i), rates is not None
                           and bool(np.isfinite(log_r[i]).any()), bool(use[i])) for j, i in enumerate(idx)]
            local = level_weights(values, errors.shape[1], horizon, points)
            got = outlook_batch(rows.starts[idx], rows.steps[idx], point, errors, question.relative,
                                ERROR_HALF_LIFE_PATHS, question.threshold, question.direction, infos, local,
                                scratch)
            found.update(zip(idx.tolist(), got))
    return HoltCycle(batch.params, [found[i] for i in range(windows.shape[0])], rate_params)


def _rate_states(log_r: FLOAT, steps: FLOAT, refit: NDArray[np.bool_], rates: Rates | None
                 ) -> tuple[HoltBatch | None, HoltParams | None]:
    """The log rates' states (every row; NaN rows without a rate) and parameters: refitted with
    their latency's slot, or where none are kept."""
    if rates is None:
        return None, None
    has = np.isfinite(log_r).any(axis=1)
    nan = np.full(has.size, np.nan)
    params = HoltParams(nan.copy(), nan.copy(), nan.copy())
    levels = np.full(log_r.shape, np.nan)
    trends = np.full(log_r.shape, np.nan)
    if has.any():
        kept = rates.params.take(has)
        fitted = holt_prepare(log_r[has], steps[has], refit[has] | ~np.isfinite(kept.alpha), kept.alpha,
                              kept.beta, kept.phi)
        params.alpha[has], params.beta[has], params.phi[has] = (fitted.params.alpha, fitted.params.beta,
                                                                fitted.params.phi)
        levels[has], trends[has] = fitted.levels, fitted.trends
    return HoltBatch(params, levels, trends), params


def _info(params: HoltParams, j: int, step: float, points: int, knee: KneeFit, i: int, has_rate: bool,
          used: bool) -> dict[str, object]:
    """The fit's figures a Detection's details carry (the knee's where the row has a rate)."""
    info: dict[str, object] = {"model": "holt", "alpha": float(params.alpha[j]), "beta": float(params.beta[j]),
                               "phi": float(params.phi[j]), "step_seconds": step, "level_points": points}
    if has_rate:
        info["knee"] = knee_info(knee, i, used)
    return info


def knee_info(knee: KneeFit, i: int, used: bool) -> dict[str, object]:
    """What a detection says of row `i`'s knee: whether it was used, the fitted capacity (the rate
    at which the latency has no bound) and how many standard errors its slope is from zero."""
    capacity = float(knee.capacity[i])
    return {"used": used, "capacity_rate": capacity if np.isfinite(capacity) else None,
            "slope_t": round(float(knee.t[i]), 3)}
