"""The pool job of one Holt cycle: refit the due rows, filter every row, and read every series'
outlook (probability, crossing, band) in batches of equally shaped windows, so `detect` only
looks it up. Module-level and picklable, like `holt_prepare`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from detectors.forecast.holt_paths import HoltBatch, HoltParams, holt_paths, holt_prepare
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
    """The job's result: each row's parameters (refitted or kept) and outlook; the states stay in
    the pool (the outlooks are all `detect` needs of them)."""

    params: HoltParams
    outlooks: list[Outlook]


def holt_cycle(windows: FLOAT, refit: NDArray[np.bool_], alpha: FLOAT, beta: FLOAT, phi: FLOAT,
               rows: CycleRows, question: Question) -> HoltCycle:
    """`holt_prepare`, then the outlook of every row, as the one-series path in `HoltForecaster.forecast`
    would compute it from that row's trimmed states."""
    batch = holt_prepare(windows, rows.steps, refit, alpha, beta, phi)
    width = windows.shape[1]
    found: dict[int, Outlook] = {}
    scratch = Scratch()  # the chunks' work arrays, allocated once
    for size, horizon, points in sorted({*zip(rows.sizes.tolist(), rows.horizons.tolist(), rows.points.tolist())}):
        same = np.flatnonzero((rows.sizes == size) & (rows.horizons == horizon) & (rows.points == points))
        for lo in range(0, same.size, CHUNK_ROWS):
            idx = same[lo : lo + CHUNK_ROWS]
            cut = slice(width - size, width)
            sub = HoltBatch(HoltParams(batch.params.alpha[idx], batch.params.beta[idx], batch.params.phi[idx]),
                            batch.levels[idx, cut], batch.trends[idx, cut])
            values = windows[idx, cut]
            point, errors = holt_paths(sub, values, horizon, points, question.relative, scratch)
            infos = [{"model": "holt", "alpha": float(sub.params.alpha[j]), "beta": float(sub.params.beta[j]),
                      "phi": float(sub.params.phi[j]), "step_seconds": float(rows.steps[i]), "level_points": points}
                     for j, i in enumerate(idx)]
            got = outlook_batch(rows.starts[idx], rows.steps[idx], point, errors, question.relative,
                                ERROR_HALF_LIFE_PATHS, question.threshold, question.direction, infos, scratch)
            found.update(zip(idx.tolist(), got))
    return HoltCycle(batch.params, [found[i] for i in range(windows.shape[0])])
