"""What the detector reads of a predictive distribution (`Outlook`): the probability of reaching
the line, the median crossing, and the band the journal keeps. `outlook_of` reads it from one
`PathForecast`; `outlook_batch` reads it for many series at once (the Holt cycle's pool job),
with the same arithmetic per series, so the two agree bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from detectors.forecast.calibration import (
    MIN_PATHS,
    FirstPassage,
    PathForecast,
    ascending,
    first_passage_paths,
    recency_weights,
    scale_of,
)
from detectors.forecast.scratch import Scratch

FLOAT = NDArray[np.float64]
DETAIL_POINTS = 20  # forecast points kept in Detection.details (the journal, not the math)
BAND = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class Outlook:
    """A distribution as the detector uses it; `passage` is None (and `rows` empty) with fewer than
    `MIN_PATHS` error paths: no decision."""

    point: FLOAT  # (H,) the model's point path for leads 1..H
    paths: int  # error paths behind the distribution
    passage: FirstPassage | None
    rows: list[list[float]]  # the journal's forecast: up to 20 rows of [time, point, p10, p50, p90]
    info: Mapping[str, Any]  # the fit's figures, copied into Detection.details


def detail_steps(n: int, points: int = DETAIL_POINTS) -> NDArray[np.intp]:
    """The steps (of n) the journal keeps: at most `points`, evenly spread, first and last included."""
    return np.unique(np.linspace(0, n - 1, min(points, n)).round().astype(np.intp)) if n else np.empty(0, np.intp)


def forecast_rows(forecast: PathForecast) -> list[list[float]]:
    """The forecast as the journal keeps it: up to 20 rows of [time, point, p10, p50, p90]. The
    band is computed at those steps only (the per-series cost of a cycle was mostly this sort)."""
    idx = detail_steps(forecast.point.size)
    if not idx.size:
        return []
    cols = np.vstack([forecast.times[idx], forecast.point[idx], forecast.band(BAND, idx)]).round(6)
    return [[float(v) for v in row] for row in cols.T]


def outlook_of(forecast: PathForecast, threshold: float, direction: str) -> Outlook:
    """One series' outlook, read from its distribution."""
    paths = int(forecast.errors.shape[0])
    if paths < MIN_PATHS:
        return Outlook(forecast.point, paths, None, [], forecast.info)
    fp = forecast.first_passage(threshold, direction, forecast.point.size)
    return Outlook(forecast.point, paths, fp, forecast_rows(forecast), forecast.info)


def outlook_batch(starts: FLOAT, steps: FLOAT, point: FLOAT, errors: FLOAT, relative: bool, half_life: float,
                  threshold: float, direction: str, infos: Sequence[Mapping[str, Any]], local: FLOAT,
                  scratch: Scratch | None = None) -> list[Outlook]:
    """The outlook of each of a batch of series with equally long paths, as `outlook_of` would read
    it from `PathForecast.from_errors(starts[i], steps[i], point[i], errors[i], ..., local[i])`.

    Args:
        starts, steps: ``(B,)`` each row's origin time and step.
        point: ``(B, H)`` point paths; errors: ``(B, K, H)`` error paths as `holt_paths` gives them
            (left as they are).
        local: ``(B, K)`` each row's `level_weights`, multiplying the recency weights.
        scratch: where the work arrays go (the cycle's chunks reuse them), fresh ones if None.
    """
    b_count, k, horizon = errors.shape
    work = scratch if scratch is not None else Scratch()
    scaled = work.floats("paths", errors.shape)  # ours: the point is added to it in place below
    if relative:
        np.multiply(errors, scale_of(point[:, :1])[:, :, None], out=scaled)
    else:
        np.copyto(scaled, errors)
    # A row with a non-finite path drops it (and its weight): the one-series path handles that.
    whole = np.isfinite(scaled, out=work.flags("finite", errors.shape)).all(axis=(1, 2))
    out: list[Outlook | None] = [None] * b_count
    for i in np.flatnonzero(~whole):
        f = PathForecast.from_errors(float(starts[i]), float(steps[i]), point[i], errors[i], relative,
                                     half_life, infos[i], local[i])
        out[i] = outlook_of(f, threshold, direction)
    good = np.flatnonzero(whole)
    if k < MIN_PATHS:
        for i in good:
            out[i] = Outlook(point[i], k, None, [], infos[i])
    elif good.size:
        everyone = good.size == b_count
        weights = recency_weights(k, half_life)[None, :] * (local if everyone else local[good])  # (B, K)
        pt = point if everyone else point[good]
        paths = scaled if everyone else scaled[good]
        idx = detail_steps(horizon)
        # The band's steps, before the point is added in place ('clip': `out` is then unbuffered).
        at_errors = np.take(paths, idx, axis=2, out=work.floats("band", (good.size, k, idx.size)), mode="clip")
        paths += pt[:, None, :]  # as PathForecast.paths: point + error, every step
        prob, median, _ = first_passage_paths(paths, threshold, direction, weights, work)
        rows = _rows_batch(starts[good], steps[good], pt, at_errors, idx, weights)
        for j, i in enumerate(good):
            when = None if np.isnan(median[j]) else float(starts[i]) + float(steps[i]) * float(median[j])
            out[i] = Outlook(point[i], k, FirstPassage(float(prob[j]), when, k), rows[j], infos[i])
    return [o for o in out if o is not None]


def _rows_batch(starts: FLOAT, steps: FLOAT, point: FLOAT, errors: FLOAT, idx: NDArray[np.intp],
                weights: FLOAT) -> list[list[list[float]]]:
    """`forecast_rows` of each row of a batch, shape ``(B, rows, 5)``, with each row's path weights
    ``(B, K)``; `errors` are the error paths at the journal's steps `idx` only (overwritten: the
    paths)."""
    horizon = point.shape[1]
    times = starts[:, None] + steps[:, None] * np.arange(1, horizon + 1)
    at = point[:, idx]
    paths = np.add(at[:, None, :], errors, out=errors)  # (B, K, S)
    band = _band_batch(paths, weights)
    cols = np.stack([times[:, idx], at, *band], axis=1).round(6)  # (B, 5, S)
    rows: list[list[list[float]]] = cols.transpose(0, 2, 1).tolist()
    return rows


def _band_batch(paths: FLOAT, weights: FLOAT) -> list[FLOAT]:
    """`PathForecast.band` of each row of ``(B, K, S)`` paths with its own ``(B, K)`` weights, one
    ``(B, S)`` per quantile of `BAND`: the same sort and cumulative sum, every row at once."""
    order, ranked = ascending(np.ascontiguousarray(paths.transpose(0, 2, 1)))  # (B, S, K)
    cum = np.cumsum(weights[np.arange(paths.shape[0])[:, None, None], order], axis=-1)
    cum /= weights.sum(axis=1)[:, None, None]
    return [np.take_along_axis(ranked, np.argmax(cum >= q, axis=-1)[:, :, None], axis=-1)[:, :, 0] for q in BAND]
