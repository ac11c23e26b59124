"""Holt's predictive distribution for a batch of equally long windows: fit, filter again for the
state at every past origin, and turn the backcasts into calibrated error paths.

Module-level and picklable (`holt_batch` runs in the process pool); the detector and the offline
evaluation call the same functions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from detectors.forecast.calibration import BURN_IN_POINTS, error_paths
from detectors.forecast.holt_fit import HoltFit, damped_sums, fit_holt, holt_states, row_starts
from detectors.forecast.scratch import Scratch

FLOAT = NDArray[np.float64]


@dataclass(frozen=True)
class HoltParams:
    """Smoothing parameters of a batch (each shape ``(B,)``): fitted now or on an earlier cycle."""

    alpha: FLOAT
    beta: FLOAT
    phi: FLOAT

    @classmethod
    def of(cls, fit: HoltFit) -> "HoltParams":
        return cls(fit.alpha, fit.beta, fit.phi)

    @classmethod
    def stack(cls, rows: "list[HoltParams]") -> "HoltParams":
        return cls(*(np.concatenate([getattr(r, f) for r in rows]) for f in ("alpha", "beta", "phi")))

    def row(self, i: int) -> "HoltParams":
        return HoltParams(self.alpha[i : i + 1], self.beta[i : i + 1], self.phi[i : i + 1])


@dataclass(frozen=True)
class HoltBatch:
    """Parameters and filtered states of a batch of windows (shape ``(B, n)`` each)."""

    params: HoltParams
    levels: FLOAT
    trends: FLOAT

    def row(self, i: int) -> "HoltBatch":
        return HoltBatch(self.params.row(i), self.levels[i : i + 1], self.trends[i : i + 1])


def holt_fit_params(windows: FLOAT, step_seconds: FLOAT | float, horizon_points: int = 0) -> HoltParams:
    """Fit each row's parameters (the costly grid search; the pool job), scored by the error
    `horizon_points` ahead (one step when 0), each row at its sampling step (one for all or one each)."""
    return HoltParams.of(fit_holt(windows, horizon_points=horizon_points, step_seconds=step_seconds))


def holt_batch(windows: FLOAT, step_seconds: FLOAT | float, params: HoltParams | None = None,
               horizon_points: int = 0) -> HoltBatch:
    """Filter each row with its parameters (fitted here when None) for its states."""
    p = params if params is not None else holt_fit_params(windows, step_seconds, horizon_points)
    levels, trends = holt_states(windows, p.alpha, p.beta, p.phi)
    return HoltBatch(p, levels, trends)


def holt_prepare(windows: FLOAT, steps: FLOAT, refit: NDArray[np.bool_], alpha: FLOAT, beta: FLOAT, phi: FLOAT,
                 horizon_points: int = 0) -> HoltBatch:
    """The pool job of one cycle: refit the rows whose slot is due (NaN-padded rows are shorter
    histories), keep the given parameters for the others, and filter every row for its states."""
    params = HoltParams(alpha.astype(np.float64, copy=True), beta.astype(np.float64, copy=True),
                        phi.astype(np.float64, copy=True))
    if refit.any():
        fresh = holt_fit_params(windows[refit], steps[refit], horizon_points)
        params.alpha[refit], params.beta[refit], params.phi[refit] = fresh.alpha, fresh.beta, fresh.phi
    return holt_batch(windows, steps, params)


def holt_paths(batch: HoltBatch, windows: FLOAT, horizon_steps: int, points: int,
               relative: bool, scratch: Scratch | None = None) -> tuple[FLOAT, FLOAT]:
    """Now's point paths and the past error paths of a batch (the errors in `scratch`'s
    "errors" buffer when one is given, valid until its next use).

    Returns:
        ``point`` of shape ``(B, H)`` and ``errors`` of shape ``(B, K, H)`` (relative or absolute,
        as asked; `PathForecast.from_errors` scales relative ones to now).
    """
    y = np.atleast_2d(windows)
    b_count, n = y.shape
    sums = damped_sums(batch.params.phi, horizon_steps)  # (B, H)
    point = batch.levels[:, -1:] + sums * batch.trends[:, -1:]
    first = min(BURN_IN_POINTS, max(n - 1, 0))
    last = n - 1 - horizon_steps - points // 2
    if last < first:
        return point, np.empty((b_count, 0, horizon_steps))
    shape = (b_count, last + 1 - first, horizon_steps)
    back = scratch.floats("errors", shape) if scratch is not None else np.empty(shape)
    np.multiply(sums[:, None, :], batch.trends[:, first : last + 1, None], out=back)
    back += batch.levels[:, first : last + 1, None]  # in place: the largest array of a cycle
    # A left-padded (shorter) row: origins in its own burn-in say nothing (NaN paths do not count).
    starts = row_starts(y)
    early = np.arange(first, last + 1)[None, :] < (starts + BURN_IN_POINTS)[:, None]
    if early.any():
        np.copyto(back, np.nan, where=early[:, :, None])
    return point, error_paths(y, back, first, points, relative, out=back)
