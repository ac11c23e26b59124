"""Damped-trend Holt exponential smoothing in pure numpy, fitted by a vectorized grid search, with a
filter that does not learn a trend from a jump.

Every function takes a batch of equally long series (shape ``(B, n)``) so one call fits many;
`fit_holt` is module-level, so the Holt backend can send a batch to the process pool.

Jumps: an innovation beyond `JUMP_SIGMAS` robust noise scales is not evidence of a trend. For a
positive series the scale is a share of the current level (the robust scale of the log values),
since latency noise grows with the level; elsewhere it is the window's, in the series' units. The first
such innovation moves the level by a clipped amount only (it may be a lone outlier); a second one on
the same side in a row is a level shift, and the level moves to the new value at once. In neither
case does the trend learn from it, so a deploy that adds 80 ms, or a 2-minute burst, leaves the
trend where it was instead of kicking it up: the probability of crossing stays low rather than the
forecast extrapolating the jump.

A run of same-signed jumps is a trend, though: a level shift on the same side as the previous one,
at most `STAIR_POINTS` steps later, is a stair (a leak quantised by a summary's window, or a ramp
too steep for the noise scale, which outruns the filter), and the trend learns the rate the two
imply. Without this, every stair of a noise-free staircase moved the level and the trend never
moved: the forecaster never saw the leak.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

# The grid is coarse on purpose: one-step SSE is flat near its minimum, and the candidates
# evaluated together in one pass cost about as much as a few scalar optimizer iterations.
ALPHAS = np.array([0.05, 0.1, 0.2, 0.35, 0.5, 0.8])
# beta is a fraction of alpha (error-correction form), which keeps the trend smoother than the level.
BETA_FRACTIONS = np.array([0.02, 0.1, 0.3])
TREND_PERSISTENCE_SECONDS = np.array([600.0, 1500.0, 7200.0])
"""How long a learnt trend carries on: the damping per step is ``phi = exp(-step / tau)``. Damping
is a property of time, not of samples: a per-step grid (0.9, 0.95, 0.98) let a trend reach only
phi / (1 - phi) steps ahead (9 steps: 2 min at 15 s, 4.5 min at 30 s), so at a 15 s step a leak's
breach came into view only steps before it. One-step SSE hardly tells the candidates apart."""
DEFAULT_STEP_SECONDS = 30.0
"""The step `fit_holt` assumes when it is not told one."""


def phis_for(step_seconds: NDArray[np.float64] | float) -> NDArray[np.float64]:
    """Per row (shape ``(B, 1)``, or ``(1, 1)`` for one step), the damping of each persistence."""
    step = np.asarray(step_seconds, dtype=np.float64).reshape(-1, 1)
    return np.asarray(np.exp(-step / TREND_PERSISTENCE_SECONDS[None, :]), dtype=np.float64)
JUMP_SIGMAS = 4.0
"""An innovation beyond this many robust noise scales is a jump, not trend evidence. White noise
passes it once in ~16,000 steps; log-normal noise at 15% (heavier above) once in ~1,000, which costs
one clipped step, not a trend."""

STAIR_POINTS = 20
"""Two level shifts on the same side at most this many steps apart are a staircase (a leak
quantised by a summary's window, a knob stepped by hand), and the trend learns its rate: a run of
same-signed jumps is a trend, not a sequence of level shifts. A lone shift, or a burst (a shift
up, then one down), teaches the trend nothing."""

_JumpState = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]
"""Per candidate: the side of a jump on the step before (+1/-1, 0 for none), the side of the last
level shift (0 for none) and the steps since it."""

_A, _BF, _P = (g.ravel() for g in np.meshgrid(ALPHAS, BETA_FRACTIONS, np.arange(TREND_PERSISTENCE_SECONDS.size),
                                              indexing="ij"))
GRID_ALPHA: NDArray[np.float64] = _A
GRID_BETA: NDArray[np.float64] = _A * _BF
GRID_PERSISTENCE: NDArray[np.intp] = _P.astype(np.intp)
"""Each candidate's column of `phis_for`."""


@dataclass(frozen=True)
class HoltFit:
    """Final state and chosen parameters of a batch of fits; every field has shape ``(B,)``."""

    level: NDArray[np.float64]
    trend: NDArray[np.float64]
    alpha: NDArray[np.float64]
    beta: NDArray[np.float64]
    phi: NDArray[np.float64]
    sigma: NDArray[np.float64]  # std of one-step-ahead residuals (clipped at jumps) with the chosen parameters
    scale: NDArray[np.float64]  # the robust noise scale jumps are measured in

    def row(self, i: int) -> "HoltFit":
        """The fit of series ``i`` alone, as a batch of one."""
        return HoltFit(*(np.asarray(getattr(self, f))[i : i + 1] for f in _FIELDS))


_FIELDS = ("level", "trend", "alpha", "beta", "phi", "sigma", "scale")


def row_starts(y: NDArray[np.float64]) -> NDArray[np.intp]:
    """Index of each row's first finite value: rows may be left-padded with NaN (shorter history)."""
    finite = np.isfinite(y)
    return np.where(finite.any(axis=1), np.argmax(finite, axis=1), y.shape[1])


def robust_scale(y: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per row, the noise scale of white noise around a level from the MAD of first differences
    (a ramp shifts the differences, not their spread); never zero. NaN padding is ignored."""
    d = np.diff(y, axis=1)
    if np.isnan(d).any():
        med = np.nanmedian(d, axis=1, keepdims=True)
        mad = np.nanmedian(np.abs(d - med), axis=1)
        top = np.nanmax(np.abs(y), axis=1)
    else:
        mad = np.median(np.abs(d - np.median(d, axis=1, keepdims=True)), axis=1)
        top = np.abs(y).max(axis=1)
    floor = 1e-4 * np.maximum(top, 1e-3)  # a noise-free series: a line is not a run of jumps
    return np.asarray(np.maximum(1.4826 * mad / np.sqrt(2.0), floor), dtype=np.float64)


def relative_scale(y: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per row, `robust_scale` of the log values (noise as a share of the level); NaN for a row
    with a value at or below zero, which keeps the scale in the series' own units."""
    positive = np.all(np.isnan(y) | (y > 0), axis=1)
    out = np.full(y.shape[0], np.nan)
    if positive.any():
        with np.errstate(invalid="ignore", divide="ignore"):
            out[positive] = robust_scale(np.log(y[positive]))
    return out


class _JumpLimit:
    """The jump limit at each step: a share of the current level where the row is positive, the
    window's absolute scale elsewhere. Latency noise is multiplicative: after a shift from 160 to
    370 ms, a limit in milliseconds from a window mostly at 160 ms read ordinary noise as a
    staircase and learnt a trend from it. What does not change between steps is computed once."""

    def __init__(self, jump_sigmas: float, scale: NDArray[np.float64], relative: NDArray[np.float64]):
        self._share = jump_sigmas * relative[:, None]
        self._absolute = (jump_sigmas * scale)[:, None]
        finite = np.isfinite(relative)
        self._mode = "share" if finite.all() else "absolute" if not finite.any() else "mixed"

    def at(self, level: NDArray[np.float64]) -> NDArray[np.float64]:
        if self._mode == "absolute":
            return self._absolute
        rel: NDArray[np.float64] = self._share * np.abs(level)
        if self._mode == "share":
            return rel
        return np.where(np.isfinite(rel), rel, self._absolute)


def _initial(y: NDArray[np.float64], width: int, starts: NDArray[np.intp]
             ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Level at each row's first value, trend over its first (up to) 10 steps."""
    n = y.shape[1]
    rows = np.arange(y.shape[0])
    first = np.minimum(starts, n - 1)
    k = np.maximum(np.minimum(10, n - 1 - first), 1)
    y0 = y[rows, first]
    yk = y[rows, np.minimum(first + k, n - 1)]
    level = np.repeat(y0[:, None], width, axis=1)
    trend = np.repeat(((yk - y0) / k)[:, None], width, axis=1)
    return level, trend


def _step(
    level: NDArray[np.float64], trend: NDArray[np.float64], state: _JumpState,
    yt: NDArray[np.float64], a: NDArray[np.float64], bt: NDArray[np.float64], p: NDArray[np.float64],
    limit: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64], _JumpState, NDArray[np.float64]]:
    """One filter step. Returns the new (level, trend, jump state) and the innovation the fit
    scores (clipped at jumps, whole at a stair).

    A second jump on the same side in a row is a level shift: the level moves to the value and the
    trend does not learn. A level shift on the same side as the previous one, at most
    `STAIR_POINTS` steps later, is a stair of a staircase: the trend learns the rate the two imply
    (this shift's innovation over the steps since the last one)."""
    pending, last_side, since = state
    damped = p * trend
    forecast = level + damped
    err = yt - forecast
    clipped = np.clip(err, -limit, limit)
    side = np.sign(err - clipped)  # 0 inside the limit, else the jump's side
    shift = side * pending > 0  # a second jump on the same side in a row: a level shift
    stair = shift & (side == last_side) & (since <= STAIR_POINTS)
    new_level = np.where(shift, yt, forecast + a * clipped)
    learnt = np.where(side == 0, bt * err, np.where(stair, err / np.maximum(since, 1.0), 0.0))
    new_state = (np.where(shift, 0.0, side), np.where(shift, side, last_side), np.where(shift, 1.0, since + 1.0))
    # A stair is scored whole: a model that should have seen it coming is the better fit.
    return new_level, damped + learnt, new_state, np.where(stair, err, clipped)


def _no_jumps(level: NDArray[np.float64]) -> _JumpState:
    """The jump state before the first step: no pending jump, no level shift yet."""
    return np.zeros_like(level), np.zeros_like(level), np.full_like(level, np.inf)


_Filter = tuple[NDArray[np.float64], NDArray[np.float64], _JumpState]
"""(level, trend, jump state) of every candidate."""


def _keep_live(live: NDArray[np.bool_] | None, new: _Filter, old: _Filter) -> _Filter:
    """The new filter where the row's history has begun (`live`), the old one before it; all new
    when every row has begun (`live` None: no left padding)."""
    if live is None:
        return new
    (level, trend, state), (old_level, old_trend, old_state) = new, old
    return (np.where(live, level, old_level), np.where(live, trend, old_trend),
            (np.where(live, state[0], old_state[0]), np.where(live, state[1], old_state[1]),
             np.where(live, state[2], old_state[2])))


def _weights(n: int, starts: NDArray[np.intp], half_life_points: float | None) -> NDArray[np.float64]:
    """(B, n) weights of each row's residuals: discounted into the past, zero in its burn-in."""
    lengths = np.maximum(n - starts, 1).astype(np.float64)
    hl = np.full(starts.size, float(half_life_points)) if half_life_points else np.maximum(lengths / 4.0, 1.0)
    age = (n - 1 - np.arange(n))[None, :]
    w = 0.5 ** (age / hl[:, None])
    burn = np.minimum(5, np.maximum(lengths - 2, 0)).astype(int)  # the first residuals measure the crude start
    w[np.arange(n)[None, :] <= (starts + burn)[:, None]] = 0.0
    return np.asarray(w, dtype=np.float64)


def fit_holt(values: NDArray[np.float64], half_life_points: float | None = None,
             jump_sigmas: float = JUMP_SIGMAS, horizon_points: int = 0,
             step_seconds: NDArray[np.float64] | float = DEFAULT_STEP_SECONDS) -> HoltFit:
    """Fit damped-trend Holt to each row by minimizing (discounted, jump-clipped) one-step SSE over the grid.

    Args:
        values: shape ``(n,)`` or ``(B, n)``, regularly spaced; a row may be left-padded with NaN
            (a shorter history) but needs at least 3 finite values, the rest finite.
        half_life_points: weight of a residual halves every this many points into the past;
            ``None`` means a quarter of the row's length. Recent behaviour matters most for a
            breach forecast: an hour-old quiet stretch must not outvote a ramp that started ten
            minutes ago.
        jump_sigmas: innovations beyond this many robust noise scales are jumps (module docstring).
        horizon_points: when positive, score each candidate by its forecast error this many steps
            ahead (what a breach decision rests on) instead of one step ahead; errors are clipped
            at twice the jump limit so one level shift does not pick the parameters.
        step_seconds: each row's sampling step (one for all, or one per row): the damping
            candidates are trend persistences in seconds (`TREND_PERSISTENCE_SECONDS`).

    Returns:
        A `HoltFit` with one entry per row.
    """
    y = np.atleast_2d(np.asarray(values, dtype=np.float64))
    b_count, n = y.shape
    starts = row_starts(y)
    if n < 3 or np.any(n - starts < 3):
        raise ValueError(f"need at least 3 points per row, got {int(np.min(n - starts)) if n else 0}")
    weights = _weights(n, starts, half_life_points)
    padded = bool(starts.any())
    scale = robust_scale(y)
    jump_limit = _JumpLimit(jump_sigmas, scale, relative_scale(y))
    level, trend = _initial(y, GRID_ALPHA.size, starts)
    state = _no_jumps(level)
    sse = np.zeros_like(level)
    a, bt = GRID_ALPHA[None, :], GRID_BETA[None, :]
    p = phis_for(step_seconds)[:, GRID_PERSISTENCE]  # (B or 1, candidates)
    h = int(horizon_points)
    if h > 0:  # forecasts made h steps ago, one slot per step of a ring
        sums_h = p * (1.0 - p ** h) / (1.0 - p)  # phi + ... + phi^h
        ring = np.repeat((level + sums_h * trend)[None], h, axis=0)
        made = np.repeat(starts[None, :], h, axis=0)
    for t in range(int(starts.min()) + 1, n):
        limit = jump_limit.at(level)
        new_level, new_trend, new_state, err = _step(level, trend, state, y[:, t : t + 1], a, bt, p, limit)
        live = (t > starts)[:, None] if padded else None
        level, trend, state = _keep_live(live, (new_level, new_trend, new_state), (level, trend, state))
        if live is not None:
            err = np.where(live, err, 0.0)
        if h > 0:
            slot = t % h
            due = (t - h >= made[slot])[:, None] & (t - h > starts)[:, None]
            err = np.where(due, np.clip(y[:, t : t + 1] - ring[slot], -2.0 * limit, 2.0 * limit), 0.0)
            ring[slot] = level + sums_h * trend
            made[slot] = t
        wt = weights[:, t : t + 1]
        if wt.any():
            sse += wt * err * err
    best = np.argmin(sse, axis=1)
    rows = np.arange(b_count)
    sigma = np.sqrt(sse[rows, best] / np.maximum(weights.sum(axis=1), 1e-12))
    return HoltFit(
        level=level[rows, best],
        trend=trend[rows, best],
        alpha=GRID_ALPHA[best],
        beta=GRID_BETA[best],
        phi=np.broadcast_to(p, sse.shape)[rows, best],
        sigma=sigma,
        scale=scale,
    )


def holt_states(values: NDArray[np.float64], alpha: NDArray[np.float64], beta: NDArray[np.float64],
                phi: NDArray[np.float64], jump_sigmas: float = JUMP_SIGMAS
                ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Level and trend after every point of each row, filtered with the given parameters (one per
    row): what a forecast from each past origin would have said. The parameters may come from an
    earlier fit (they change slowly); the jump scale is always this window's.

    Returns:
        Two arrays of shape ``(B, n)`` (time-major in memory), NaN before each row's first value.
    """
    y = np.atleast_2d(np.asarray(values, dtype=np.float64))
    b_count, n = y.shape
    starts = row_starts(y)
    padded = bool(starts.any())
    level, trend = _initial(y, 1, starts)
    state = _no_jumps(level)
    a, bt, p = (np.asarray(v, dtype=np.float64).reshape(-1, 1) for v in (alpha, beta, phi))
    jump_limit = _JumpLimit(jump_sigmas, robust_scale(y), relative_scale(y))
    # Time-major while filtering: a step writes one contiguous row, not a column of (B, n).
    levels = np.full((n, b_count), np.nan)
    trends = np.full((n, b_count), np.nan)
    rows = np.arange(b_count)
    first = np.minimum(starts, n - 1)
    levels[first, rows], trends[first, rows] = level[:, 0], trend[:, 0]
    for t in range(int(starts.min()) + 1, n):
        limit = jump_limit.at(level)
        new_level, new_trend, new_state, _ = _step(level, trend, state, y[:, t : t + 1], a, bt, p, limit)
        live = (t > starts)[:, None] if padded else None
        level, trend, state = _keep_live(live, (new_level, new_trend, new_state), (level, trend, state))
        if live is not None:
            levels[t] = np.where(live[:, 0], level[:, 0], levels[t])
            trends[t] = np.where(live[:, 0], trend[:, 0], trends[t])
        else:
            levels[t], trends[t] = level[:, 0], trend[:, 0]
    return levels.T, trends.T


def damped_sums(phi: NDArray[np.float64], steps: int) -> NDArray[np.float64]:
    """``phi + phi^2 + ... + phi^h`` for h = 1..steps; shape ``(B, steps)``."""
    h = np.arange(1, steps + 1, dtype=np.float64)[None, :]
    return np.cumsum(np.asarray(phi, dtype=np.float64)[:, None] ** h, axis=1)


def holt_forecast(fit: HoltFit, steps: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Point forecast and its model standard error for 1..steps ahead; both shape ``(B, steps)``.

    The variance is the ETS(A,Ad,N) one: ``sigma^2 * (1 + sum_{j<h} (alpha + beta*phi_j)^2)``
    with ``phi_j = phi + ... + phi^j``. The detector does not use it: its spread comes from the
    series' own past forecast errors (detectors/forecast/calibration.py).
    """
    phi_cum = damped_sums(fit.phi, steps)
    point = fit.level[:, None] + phi_cum * fit.trend[:, None]
    incr = (fit.alpha[:, None] + fit.beta[:, None] * phi_cum) ** 2
    var_mult = 1.0 + np.concatenate([np.zeros((incr.shape[0], 1)), np.cumsum(incr, axis=1)[:, :-1]], axis=1)
    se = fit.sigma[:, None] * np.sqrt(var_mult)
    return point, se
