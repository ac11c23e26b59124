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
from detectors.forecast.load_knee import KneeFit, knee_latency, knee_rows
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

    def take(self, rows: NDArray[np.bool_] | NDArray[np.intp]) -> "HoltParams":
        """The parameters of the rows selected (a mask or indices)."""
        return HoltParams(self.alpha[rows], self.beta[rows], self.phi[rows])


@dataclass(frozen=True)
class HoltBatch:
    """Parameters and filtered states of a batch of windows (shape ``(B, n)`` each)."""

    params: HoltParams
    levels: FLOAT
    trends: FLOAT

    def row(self, i: int) -> "HoltBatch":
        return HoltBatch(self.params.row(i), self.levels[i : i + 1], self.trends[i : i + 1])

    def take(self, rows: NDArray[np.bool_] | NDArray[np.intp]) -> "HoltBatch":
        """The rows selected (a mask or indices)."""
        return HoltBatch(self.params.take(rows), self.levels[rows], self.trends[rows])


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


def holt_knee_paths(unexplained: HoltBatch, rates: HoltBatch, knee: KneeFit, windows: FLOAT, horizon_steps: int,
                    points: int, relative: bool, line: float) -> tuple[FLOAT, FLOAT]:
    """`holt_paths` of a capacity knee (detectors/forecast/load_knee.py): the point paths and
    backcasts of the latency that the forecast log rate and the forecast unexplained part imply,
    their errors measured against the latency windows themselves, as for plain Holt.

    Args:
        unexplained: Holt's states of ``log g`` (the latency the rate does not explain).
        rates: Holt's states of the log rate, on the same grid.
        knee: the rows' knee fits (all rows of the batch use theirs).
        windows: the latency, shape ``(B, n)``.
        line: the threshold (a rate at capacity stands at a multiple of it).
    """
    y = np.atleast_2d(windows)
    b_count, n = y.shape
    sums_g = damped_sums(unexplained.params.phi, horizon_steps)
    sums_r = damped_sums(rates.params.phi, horizon_steps)
    point = knee_latency(unexplained.levels[:, -1:] + sums_g * unexplained.trends[:, -1:],
                         rates.levels[:, -1:] + sums_r * rates.trends[:, -1:], knee, line)
    first = min(BURN_IN_POINTS, max(n - 1, 0))
    last = n - 1 - horizon_steps - points // 2
    if last < first:
        return point, np.empty((b_count, 0, horizon_steps))
    cut = slice(first, last + 1)
    log_g = unexplained.levels[:, cut, None] + sums_g[:, None, :] * unexplained.trends[:, cut, None]
    log_r = rates.levels[:, cut, None] + sums_r[:, None, :] * rates.trends[:, cut, None]
    back = knee_latency(log_g, log_r, knee, line)
    starts = row_starts(y)
    early = np.arange(first, last + 1)[None, :] < (starts + BURN_IN_POINTS)[:, None]
    if early.any():
        np.copyto(back, np.nan, where=early[:, :, None])
    return point, error_paths(y, back, first, points, relative, out=back)


def holt_load_fit_params(windows: FLOAT, rates: FLOAT | None, step_seconds: FLOAT | float
                         ) -> tuple[HoltParams, HoltParams | None]:
    """The parameters of the primary rows (``log g`` where the knee is usable, the latency
    elsewhere) and of the log rates (None without any rate; rows without one get NaN)."""
    primary, log_r, _ = knee_rows(windows, rates)
    params = holt_fit_params(primary, step_seconds)
    has = np.isfinite(log_r).any(axis=1)
    if not has.any():
        return params, None
    nan = np.full(has.size, np.nan)
    rate_params = HoltParams(nan.copy(), nan.copy(), nan.copy())
    steps = np.broadcast_to(np.asarray(step_seconds, dtype=np.float64), has.shape)
    fresh = holt_fit_params(log_r[has], steps[has])
    rate_params.alpha[has], rate_params.beta[has], rate_params.phi[has] = fresh.alpha, fresh.beta, fresh.phi
    return params, rate_params


def holt_load_paths(windows: FLOAT, rates: FLOAT | None, params: HoltParams, rate_params: HoltParams | None,
                    step_seconds: FLOAT | float, horizon_steps: int, points: int, relative: bool, line: float
                    ) -> tuple[FLOAT, FLOAT, KneeFit]:
    """`holt_paths`, with a capacity knee where a row's rate explains its latency: the point paths
    and error paths of each row (the knee's where usable, plain Holt's elsewhere) and the knee fits.
    `params` are the primary rows' (as `holt_load_fit_params` fits them; fitted on the other kind
    of primary row they are used as they are), `rate_params` the log rates'."""
    y = np.atleast_2d(windows)
    primary, log_r, knee = knee_rows(y, rates)
    steps = np.broadcast_to(np.asarray(step_seconds, dtype=np.float64), (y.shape[0],))
    use = knee.usable & (np.isfinite(rate_params.alpha) if rate_params is not None else False)
    batch = holt_batch(primary, steps, params)
    if not use.any():
        point, errors = holt_paths(batch, y, horizon_steps, points, relative)
        return point, errors, knee
    assert rate_params is not None
    plain = ~use
    out_point = np.empty((y.shape[0], horizon_steps))
    p_knee, e_knee = holt_knee_paths(
        batch.take(use), holt_batch(log_r[use], steps[use], rate_params.take(use)), knee.take(use), y[use],
        horizon_steps, points, relative, line)
    out_errors = np.full((y.shape[0], e_knee.shape[1], horizon_steps), np.nan)
    out_point[use], out_errors[use] = p_knee, e_knee
    if plain.any():
        p_plain, e_plain = holt_paths(batch.take(plain), y[plain], horizon_steps, points, relative)
        out_point[plain], out_errors[plain] = p_plain, e_plain
    return out_point, out_errors, knee
