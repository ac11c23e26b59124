"""The predictive distribution every forecaster returns, calibrated on the series' own recent
forecast errors, and the first-passage probability read from it.

How: a forecaster gives its point path from now, and the point paths it *would have given* from
each past origin in the queried range (backcasts). The error path of an origin is what the series'
level then did minus what was forecast, for every lead 1..H. Now's distribution is now's point path
plus each of those error paths (scaled to now's level when errors are relative): an ensemble of
whole paths, so the dependence between leads, the model's bias on this series and its noise all come
from the series itself (split-conformal in spirit: the calibration set is the recent past; nothing
is assumed about the error law). P(the level reaches the line within the horizon) is the share of
paths that reach it. Everything is recomputed from the range each cycle: a restart loses nothing.

The level is the series' centered mean over ``level_points`` scrapes: a lone scrape over the line is
noise, not a breach. With one point the level is the value itself.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from detectors.forecast.scratch import Scratch

FLOAT = NDArray[np.float64]
BURN_IN_POINTS = 20
"""Backcasts from the first points of a window mostly measure the filter's crude start: skipped."""
MIN_PATHS = 30
"""Fewer past error paths than this and the probability is not worth stating."""


def level_points(level_window_seconds: float, step_seconds: float) -> int:
    """Scrapes in the level's window: odd (centered), at least one."""
    k = int(level_window_seconds // step_seconds) if step_seconds > 0 else 1
    return max(1, 2 * (k // 2) + 1)


def centered_level(values: FLOAT, points: int) -> FLOAT:
    """The centered mean over `points` (odd) of each row; NaN where the window runs off an end."""
    y = np.atleast_2d(values)
    if points <= 1:
        return y.astype(np.float64, copy=True)
    r = points // 2
    c = np.cumsum(np.pad(y, ((0, 0), (1, 0))), axis=1)
    out = np.full(y.shape, np.nan)
    out[:, r : y.shape[1] - r] = (c[:, points:] - c[:, :-points]) / points
    return out


def trailing_level(values: FLOAT, points: int) -> FLOAT:
    """The mean of the last `points` values of each row: the level as known now."""
    y = np.atleast_2d(values)
    return np.asarray(y[:, -points:].mean(axis=1), dtype=np.float64)


def error_paths(values: FLOAT, backcasts: FLOAT, first_origin: int, points: int,
                relative: bool, out: FLOAT | None = None) -> FLOAT:
    """The error paths of past forecasts, for one series or a batch.

    Args:
        values: the regular series, shape ``(n,)`` or ``(B, n)``.
        backcasts: shape ``(m, H)`` or ``(B, m, H)``: row j is the point path forecast from
            origin ``first_origin + j`` for leads 1..H.
        first_origin: index of the origin of the first backcast.
        points: the level's window (odd).
        relative: errors as a share of the forecast's first step (multiplicative noise, as
            latency has), else in the series' unit.
        out: a batch's ``(B, m, H)`` array to write the errors into (the backcasts themselves
            may be overwritten so: each error needs only its own backcast).

    Returns:
        Shape ``(K, H)`` (or ``(B, K, H)``): one row per origin whose whole path's level is known
        (the level needs ``points // 2`` scrapes past the path's end), oldest first.
    """
    single = np.ndim(values) == 1
    y = np.atleast_2d(values)
    back = backcasts[None] if single else backcasts
    n = y.shape[1]
    m, horizon = back.shape[1:]
    k = min(n - 1 - horizon - points // 2 - first_origin + 1, m)
    if k <= 0:
        out = np.empty((y.shape[0], 0, horizon))
        return out[0] if single else out
    level = centered_level(y, points)
    future = sliding_window_view(level[:, first_origin + 1 :], horizon, axis=1)[:, :k]
    scale = scale_of(back[:, :k, :1]) if relative else None  # before `out` may overwrite it
    err = np.subtract(future, back[:, :k], out=None if out is None else out[:, :k])
    if scale is not None:
        err /= scale
    return err[0] if single else err


LEVEL_BANDWIDTH = 0.5
"""The level kernel's width, in robust spreads (IQR / 1.349) of the window's log level."""
LEVEL_FLOOR = 0.02
"""What every path keeps of the kernel: a far level is a weaker guide, not none, and a level the
window never saw before keeps every path."""


def level_weights(values: FLOAT, paths: int, horizon: int, points: int) -> FLOAT:
    """How much each past error path says about now, by how near the series' level at its origin
    was to now's (localized conformal): a series turns back where it turned back before, and
    runs on where it ran on, more than its average past says.

    The level is the trailing mean over `points` scrapes, as known at each origin; nearness is a
    Gaussian kernel on the log levels' difference, `LEVEL_BANDWIDTH` robust spreads wide, plus
    `LEVEL_FLOOR`.

    Args:
        values: the windows the paths were measured on, shape ``(n,)`` or ``(B, n)``.
        paths, horizon: the error paths' shape ``(K, H)``: their origins are the K latest whose
            whole path is known (`error_paths`' rows), the last at ``n - 1 - H - points // 2``.

    Returns:
        Shape ``(K,)`` (or ``(B, K)``), multiplying the recency weights; NaN levels get the floor.
    """
    single = np.ndim(values) == 1
    y = np.atleast_2d(values)
    b_count, n = y.shape
    last = n - 1 - horizon - points // 2
    if paths <= 0 or last < paths - 1:
        out = np.ones((b_count, max(paths, 0)))
        return out[0] if single else out
    c = np.cumsum(np.pad(y, ((0, 0), (points, 0)), mode="edge"), axis=1)
    level = np.log(np.maximum((c[:, points:] - c[:, :-points]) / points, 1e-12))
    with warnings.catch_warnings():  # a row with no level at all: NaN spread, every path the floor
        warnings.simplefilter("ignore", RuntimeWarning)
        q75, q25 = np.nanpercentile(level, [75, 25], axis=1)
    spread = np.maximum((q75 - q25) / 1.349, 1e-3)[:, None]
    d = (level[:, last - paths + 1 : last + 1] - level[:, -1:]) / (LEVEL_BANDWIDTH * spread)
    out = np.asarray(np.nan_to_num(np.exp(-0.5 * d * d), nan=0.0) + LEVEL_FLOOR, dtype=np.float64)
    return out[0] if single else out


def recency_weights(paths: int, half_life: float) -> FLOAT:
    """Weights of error paths (oldest first) halving every `half_life` origins into the past: the
    recent past is the better guide to now (weighted conformal, for a series that drifts)."""
    age = np.arange(paths - 1, -1, -1, dtype=np.float64)
    return np.asarray(0.5 ** (age / max(half_life, 1e-9)), dtype=np.float64)


def first_passage_batch(point: FLOAT, errors: FLOAT, relative: bool, threshold: float, direction: str,
                        steps: int, weights: FLOAT | None = None) -> tuple[FLOAT, FLOAT, FLOAT]:
    """P(the level reaches the threshold within `steps`) for a batch, and the weighted median
    first-passage step (1-based; NaN where no path crosses).

    Args:
        point: ``(B, H)`` point paths.
        errors: ``(B, K, H)`` error paths (relative ones are scaled by each row's first step); a
            path with a NaN (before a shorter row's history) does not count.
        weights: ``(K,)`` path weights (oldest first), or ``(B, K)`` per row; equal when None.

    Returns:
        ``probability`` (B,), smoothed like a Jeffreys estimate: ``(w_hit + w/2) / (w_all + w)``
        with w the mean weight, so no finite ensemble says 0 or 1 (NaN without any path);
        ``median_step`` (B,); and ``paths`` (B,), the number of valid paths.
    """
    k, horizon = errors.shape[1:]
    steps = max(1, min(steps, horizon))
    sign = 1.0 if direction == "above" else -1.0
    scale = scale_of(point[:, :1])[:, :, None] if relative else 1.0
    paths = point[:, None, :steps] + errors[:, :, :steps] * scale
    valid = np.isfinite(paths).all(axis=2)
    hit = (sign * (paths - threshold) >= 0) & valid[:, :, None]
    return passage_of_hits(hit, valid, np.ones(k) if weights is None else weights, horizon)


def first_passage_paths(paths: FLOAT, threshold: float, direction: str, weights: FLOAT,
                        scratch: Scratch | None = None) -> tuple[FLOAT, FLOAT, FLOAT]:
    """`first_passage_batch` of whole paths ``(B, K, H)`` (point plus scaled errors, every step
    counted), with one comparison per point instead of a subtraction, a product and a comparison:
    ``sign * (x - t) >= 0`` is ``x >= t`` (or ``x <= t``) for every finite x."""
    hit_out, finite_out = (None, None) if scratch is None else (scratch.flags("hit", paths.shape),
                                                                 scratch.flags("finite", paths.shape))
    compare = np.greater_equal if direction == "above" else np.less_equal
    hit = compare(paths, threshold, out=hit_out)
    finite = np.isfinite(paths, out=finite_out)
    if finite.all():  # the usual case: one pass, not a reduction per path
        valid = np.ones(paths.shape[:2], dtype=np.bool_)
    else:
        valid = finite.all(axis=2)
        hit &= valid[:, :, None]
    return passage_of_hits(hit, valid, weights, paths.shape[2])


def passage_of_hits(hit: NDArray[np.bool_], valid: NDArray[np.bool_], weights: FLOAT, horizon: int
                    ) -> tuple[FLOAT, FLOAT, FLOAT]:
    """The probability, median first-passage step and valid path count of `first_passage_batch`
    from which steps of which paths reach the line (``hit``, (B, K, steps)) and which paths count."""
    b_count = hit.shape[0]
    # The first hit's index (0 for a path with none), and whether it is a hit: `any` without its pass.
    at = np.argmax(hit, axis=2)
    crossed = np.take_along_axis(hit, at[:, :, None], axis=2)[:, :, 0]
    w = (weights if weights.ndim == 2 else weights[None, :]) * valid
    total = w.sum(axis=1)
    count = valid.sum(axis=1)
    unit = np.where(count > 0, total / np.maximum(count, 1), 1.0)
    hit_w = (crossed * w).sum(axis=1)
    probability = np.where(count > 0, (hit_w + unit / 2.0) / (total + unit), np.nan)
    first = np.where(crossed, at, horizon + 1).astype(np.float64)
    order = np.argsort(first, axis=1)
    cum = np.cumsum(np.take_along_axis(w, order, axis=1), axis=1)
    pick = np.argmax(cum >= (hit_w / 2.0)[:, None], axis=1)
    median = np.take_along_axis(first, order, axis=1)[np.arange(b_count), pick] + 1.0
    return probability, np.where(hit_w > 0, median, np.nan), count.astype(np.float64)


def scale_of(first_step: FLOAT) -> FLOAT:
    """The first step's size that relative errors are shares of (never zero)."""
    return np.maximum(np.abs(first_step), 1e-12)


def ascending(values: FLOAT) -> tuple[NDArray[np.intp], FLOAT]:
    """The order that sorts `values` along the last axis (ties by index), and the sorted values.

    Positive finite floats order as their bits do, so each value's bits, with its index in the
    lowest bits, sort as one integer array: a vectorized sort, about 3x cheaper than an argsort.
    Values apart only in those bits could come out of order: checked, and then argsort decides."""
    k = values.shape[-1]
    if k > 1 and values.size and values.min() > 0 and np.isfinite(values).all():  # NaN fails `> 0`
        bits = (k - 1).bit_length()
        keys = np.ascontiguousarray(values).view(np.int64) >> bits << bits
        keys |= np.arange(k, dtype=np.int64)
        keys.sort(axis=-1)
        order = (keys & ((1 << bits) - 1)).astype(np.intp)
        ranked = np.take_along_axis(values, order, axis=-1)
        if (ranked[..., 1:] >= ranked[..., :-1]).all():
            return order, ranked
    order = np.argsort(values, axis=-1)
    return order, np.take_along_axis(values, order, axis=-1)


@dataclass(frozen=True)
class FirstPassage:
    """What the distribution says about the line within the horizon."""

    probability: float  # P(the level reaches the line within the horizon), Jeffreys-smoothed
    crossing_time: float | None  # median first-passage time of the paths that cross
    paths: int  # error paths behind it


@dataclass(frozen=True)
class PathForecast:
    """A predictive distribution of the series' level over the next steps: the point path plus the
    series' own past error paths. `Forecaster.forecast` returns one."""

    start: float  # time of the last grid point (the forecast's origin)
    step: float
    point: FLOAT  # (H,) the model's point path for leads 1..H
    errors: FLOAT  # (K, H) error paths, in the series' unit at now's level, oldest first
    weights: FLOAT  # (K,) weight of each error path
    info: Mapping[str, Any]  # the fit's figures, copied into Detection.details

    @classmethod
    def from_errors(cls, start: float, step: float, point: FLOAT, errors: FLOAT, relative: bool,
                    half_life: float, info: Mapping[str, Any], local: FLOAT | None = None) -> "PathForecast":
        """Now's point path with past error paths (relative ones scaled by now's first step),
        weighted by recency and by `local` (``(K,)``, `level_weights`) when given."""
        scaled = errors * scale_of(point[:1]) if relative else errors
        weights = recency_weights(errors.shape[0], half_life)
        if local is not None:
            weights = weights * local
        keep = np.isfinite(scaled).all(axis=1)
        return cls(start, step, point, scaled[keep], weights[keep], info)

    @property
    def times(self) -> FLOAT:
        return self.start + self.step * np.arange(1, self.point.size + 1)

    @property
    def paths(self) -> FLOAT:
        return self.point[None, :] + self.errors

    def band(self, quantiles: tuple[float, ...] = (0.1, 0.5, 0.9),
             steps: NDArray[np.intp] | None = None) -> FLOAT:
        """Weighted quantiles of the level at each step (only at `steps` when given), shape
        ``(len(quantiles), H)`` (or ``len(steps)``): one sort, one gather for every quantile."""
        point = self.point if steps is None else self.point[steps]
        paths = point[None, :] + (self.errors if steps is None else self.errors[:, steps])
        if not paths.shape[0]:
            return np.repeat(point[None, :], len(quantiles), axis=0)
        order, ranked = ascending(np.ascontiguousarray(paths.T))  # (H, K): the paths at each step
        cum = np.cumsum(self.weights[order], axis=-1) / self.weights.sum()
        cols = np.arange(paths.shape[1])
        rows = [ranked[cols, np.argmax(cum >= q, axis=-1)] for q in quantiles]
        return np.asarray(rows, dtype=np.float64)

    def first_passage(self, threshold: float, direction: str, steps: int) -> FirstPassage:
        """P(the level reaches `threshold` within the first `steps` steps), and when."""
        p, median, _ = first_passage_batch(self.point[None], self.errors[None], False, threshold, direction,
                                           steps, self.weights)
        when = None if np.isnan(median[0]) else self.start + self.step * float(median[0])
        return FirstPassage(float(p[0]), when, int(self.errors.shape[0]))


ANCHOR_POINTS = 5
"""A cached curve is shifted by the median of this many latest residuals (Prophet between refits)."""


def anchored_paths(values: FLOAT, curve: FLOAT, horizon: int, points: int, relative: bool,
                   first_origin: int = BURN_IN_POINTS, anchor_points: int = ANCHOR_POINTS) -> tuple[FLOAT, FLOAT]:
    """A curve model's point path and past error paths (Prophet's, fitted once per refit interval).

    The forecast from any origin o is the curve shifted by the median of the `anchor_points`
    residuals up to o: a level change since the fit shows at once, as it does in the detector.

    Args:
        values: the regular series, shape ``(n,)``.
        curve: the model's curve on the same grid and `horizon` steps beyond, shape ``(n + horizon,)``.

    Returns:
        ``point`` (H,) from the last origin and ``errors`` (K, H), as `error_paths`.
    """
    n = values.size
    residual = values - curve[:n]
    a = max(1, min(anchor_points, n))
    offsets = np.full(n, np.nan)
    offsets[a - 1 :] = np.median(sliding_window_view(residual, a), axis=1)
    point = curve[n : n + horizon] + offsets[-1]
    first = max(first_origin, a - 1)
    last = n - 1 - horizon - points // 2
    if last < first:
        return point, np.empty((0, horizon))
    origins = np.arange(first, last + 1)
    back = sliding_window_view(curve[first + 1 :], horizon)[: origins.size] + offsets[origins, None]
    return point, error_paths(values, back, first, points, relative)
