"""The capacity knee: latency that the request rate explains, and the part it does not.

A server near saturation answers in about ``s / (1 - rate / C)`` (a queue's knee): its inverse
latency falls in a straight line with the rate, ``1 / latency = a - b * rate``. Where that line
holds (the slope is many standard errors from zero over the window), the latency's forecast is
the rate's forecast put through the knee, times what the rate does not explain:

    latency = g / (a - b * rate),   g = latency * (a - b * rate)

so a rate growing toward capacity (``a / b``) is forecast as the accelerating latency it brings,
which a trend on the latency alone sees only minutes before the breach, and a leak the rate does
not explain still shows in g. Both the rate and g are forecast on a log scale (their noise is
multiplicative) by the same Holt filter the plain forecaster uses. Pure functions over batches of
equally long windows (shape ``(B, n)``, NaN-padded on the left); no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FLOAT = NDArray[np.float64]

KNEE_MIN_T = 4.0
"""The knee is used only where its slope is at least this many standard errors above zero. The
window's residuals are autocorrelated (a leak, the load's own wave), so the nominal error is too
small; four of them is a conservative bar that a rate unrelated to the latency does not pass."""

SATURATION_LINE_MULTIPLE = 10.0
"""A forecast rate at or past the fitted capacity has no finite latency: it stands at this many
times the line (crossed either way; a finite value keeps the error paths finite)."""

RATE_FLOOR_SHARE = 1e-3
"""A rate of zero (an idle minute) is read as this share of the window's largest rate before its
logarithm is taken."""


@dataclass(frozen=True)
class KneeFit:
    """Per row, shape ``(B,)``: the line ``1 / latency = intercept - slope * rate`` and whether it
    is used. A row is usable when the slope is positive and at least `KNEE_MIN_T` standard errors
    from zero, and every point of the window sits below the fitted capacity."""

    intercept: FLOAT
    slope: FLOAT
    t: FLOAT  # slope / its standard error
    usable: NDArray[np.bool_]

    def take(self, rows: NDArray[np.bool_] | NDArray[np.intp]) -> "KneeFit":
        """The fits of the rows selected (a mask or indices)."""
        return KneeFit(self.intercept[rows], self.slope[rows], self.t[rows], self.usable[rows])

    @property
    def capacity(self) -> FLOAT:
        """The rate at which the fitted latency has no bound (``intercept / slope``); inf where flat."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.slope > 0, self.intercept / self.slope, np.inf)


def fit_knee(latency: FLOAT, rate: FLOAT) -> KneeFit:
    """The knee of each row: weighted least squares of ``1 / latency`` on the rate.

    The weights are ``latency ** 2``: latency's noise is a share of it, so ``1 / latency`` has a
    spread proportional to itself, and these weights make the residuals equally spread. Points where
    either series is missing or the latency is not positive do not count.
    """
    y = np.atleast_2d(np.asarray(latency, dtype=np.float64))
    r = np.atleast_2d(np.asarray(rate, dtype=np.float64))
    ok = np.isfinite(y) & np.isfinite(r) & (y > 0)
    y0 = np.where(ok, y, 1.0)
    w = np.where(ok, y0 * y0, 0.0)
    u = np.where(ok, 1.0 / y0, 0.0)
    x = np.where(ok, r, 0.0)
    sw = np.maximum(w.sum(axis=1), 1e-300)
    mx = (w * x).sum(axis=1) / sw
    mu = (w * u).sum(axis=1) / sw
    dx = np.where(ok, x - mx[:, None], 0.0)
    du = np.where(ok, u - mu[:, None], 0.0)
    sxx = (w * dx * dx).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = (w * dx * du).sum(axis=1) / sxx
        slope = -beta
        intercept = mu - beta * mx
        resid = np.where(ok, du - beta[:, None] * dx, 0.0)
        dof = np.maximum(ok.sum(axis=1) - 2, 1)
        se = np.sqrt((w * resid * resid).sum(axis=1) / dof / sxx)
        t = slope / se
        below = np.where(ok, intercept[:, None] - slope[:, None] * x > 0, True).all(axis=1)
    good = (np.isfinite(t) & (t >= KNEE_MIN_T) & (intercept > 0) & below & (ok.sum(axis=1) >= 3))
    return KneeFit(np.nan_to_num(intercept), np.nan_to_num(slope), np.nan_to_num(t), good)


def log_rate(rate: FLOAT) -> FLOAT:
    """The rate on a log scale, zeros floored at `RATE_FLOOR_SHARE` of each row's largest rate."""
    r = np.atleast_2d(np.asarray(rate, dtype=np.float64))
    top = np.max(np.where(np.isfinite(r), r, -np.inf), axis=1, keepdims=True, initial=-np.inf)
    floor = np.maximum(np.where(np.isfinite(top), top, 1.0) * RATE_FLOOR_SHARE, 1e-12)
    return np.asarray(np.log(np.maximum(r, floor)), dtype=np.float64)


def unexplained(latency: FLOAT, rate: FLOAT, fit: KneeFit) -> FLOAT:
    """``log g = log latency + log(a - b * rate)``: the latency the rate does not explain, on a log
    scale. Meaningful on usable rows (every point below capacity); NaN elsewhere."""
    y = np.atleast_2d(np.asarray(latency, dtype=np.float64))
    r = np.atleast_2d(np.asarray(rate, dtype=np.float64))
    room = fit.intercept[:, None] - fit.slope[:, None] * r
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(y) + np.log(room)
    return np.asarray(np.where((room > 0) & (y > 0), out, np.nan), dtype=np.float64)


def knee_latency(log_g: FLOAT, log_r: FLOAT, fit: KneeFit, line: float) -> FLOAT:
    """The latency that a forecast of ``log g`` and of the log rate imply (any shape whose first
    axis is the batch): ``g / (a - b * rate)``, or `SATURATION_LINE_MULTIPLE` times the line where
    the rate reaches capacity (or the quotient is larger)."""
    extra = (slice(None),) + (None,) * (np.ndim(log_g) - 1)
    room = fit.intercept[extra] - fit.slope[extra] * np.exp(log_r)
    cap = SATURATION_LINE_MULTIPLE * abs(line)
    g = np.exp(log_g)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.where(room * cap > g, g / room, cap)
    return np.asarray(out, dtype=np.float64)


def knee_rows(latency: FLOAT, rate: FLOAT | None) -> tuple[FLOAT, FLOAT, KneeFit]:
    """What the Holt filters run on: per row, ``log g`` where the knee is usable and the latency
    itself elsewhere (the primary series), the log rate (NaN rows without a rate), and the fits.

    Args:
        latency: ``(B, n)`` windows.
        rate: ``(B, n)`` the request rate on the same grid, NaN where a row has none (or None for a
            batch without any): a row is read with a knee only where its rate covers its window.
    """
    y = np.atleast_2d(np.asarray(latency, dtype=np.float64))
    if rate is None:
        nothing = np.zeros(y.shape[0])
        return y, np.full(y.shape, np.nan), KneeFit(nothing, nothing, nothing, np.zeros(y.shape[0], dtype=np.bool_))
    r = np.atleast_2d(np.asarray(rate, dtype=np.float64))
    covered = (np.isfinite(r) | ~np.isfinite(y)).all(axis=1) & np.isfinite(r).any(axis=1)
    fit = fit_knee(y, np.where(covered[:, None], r, np.nan))
    primary = np.where(fit.usable[:, None], unexplained(y, r, fit), y)
    logs = np.where(covered[:, None], log_rate(np.where(covered[:, None], r, np.nan)), np.nan)
    return primary, logs, fit
