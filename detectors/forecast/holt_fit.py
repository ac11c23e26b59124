"""Damped-trend Holt exponential smoothing in pure numpy, fitted by a vectorized grid search.

Every function takes a batch of equally long series (shape ``(B, n)``) so one call fits many;
`fit_holt` is module-level, so the Holt backend can send a batch to the process pool.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

# The grid is coarse on purpose: one-step SSE is flat near its minimum, and 54 candidates
# evaluated together in one pass cost about as much as a few scalar optimizer iterations.
ALPHAS = np.array([0.05, 0.1, 0.2, 0.35, 0.5, 0.8])
# beta is a fraction of alpha (error-correction form), which keeps the trend smoother than the level.
BETA_FRACTIONS = np.array([0.02, 0.1, 0.3])
PHIS = np.array([0.9, 0.95, 0.98])

_A, _BF, _P = (g.ravel() for g in np.meshgrid(ALPHAS, BETA_FRACTIONS, PHIS, indexing="ij"))
GRID_ALPHA: NDArray[np.float64] = _A
GRID_BETA: NDArray[np.float64] = _A * _BF
GRID_PHI: NDArray[np.float64] = _P


@dataclass(frozen=True)
class HoltFit:
    """Final state and chosen parameters of a batch of fits; every field has shape ``(B,)``."""

    level: NDArray[np.float64]
    trend: NDArray[np.float64]
    alpha: NDArray[np.float64]
    beta: NDArray[np.float64]
    phi: NDArray[np.float64]
    sigma: NDArray[np.float64]  # std of one-step-ahead residuals with the chosen parameters

    def row(self, i: int) -> "HoltFit":
        """The fit of series ``i`` alone, as a batch of one."""
        return HoltFit(*(np.asarray(getattr(self, f))[i : i + 1] for f in _FIELDS))


_FIELDS = ("level", "trend", "alpha", "beta", "phi", "sigma")


def fit_holt(values: NDArray[np.float64], half_life_points: float | None = None) -> HoltFit:
    """Fit damped-trend Holt to each row by minimizing (discounted) one-step SSE over the grid.

    Args:
        values: shape ``(n,)`` or ``(B, n)``, finite, regularly spaced, ``n >= 3``.
        half_life_points: weight of a residual halves every this many points into the past;
            ``None`` means ``n / 4``. Recent behaviour matters most for a breach forecast:
            an hour-old quiet stretch must not outvote a ramp that started ten minutes ago.

    Returns:
        A `HoltFit` with one entry per row.
    """
    y = np.atleast_2d(np.asarray(values, dtype=np.float64))
    b_count, n = y.shape
    if n < 3:
        raise ValueError(f"need at least 3 points, got {n}")
    hl = float(half_life_points) if half_life_points else max(n / 4.0, 1.0)
    weights = 0.5 ** ((n - 1 - np.arange(n)) / hl)
    burn = min(5, n - 2)  # the first residuals mostly measure the crude initial state
    weights[: burn + 1] = 0.0

    k = min(10, n - 1)
    level = np.repeat(y[:, :1], GRID_ALPHA.size, axis=1)
    trend = np.repeat(((y[:, k] - y[:, 0]) / k)[:, None], GRID_ALPHA.size, axis=1)
    sse = np.zeros_like(level)
    a, bt, p = GRID_ALPHA[None, :], GRID_BETA[None, :], GRID_PHI[None, :]
    for t in range(1, n):
        damped = p * trend
        err = y[:, t : t + 1] - (level + damped)
        if weights[t]:
            sse += weights[t] * err * err
        level = level + damped + a * err
        trend = damped + bt * err
    best = np.argmin(sse, axis=1)
    rows = np.arange(b_count)
    sigma = np.sqrt(sse[rows, best] / max(float(weights.sum()), 1e-12))
    return HoltFit(
        level=level[rows, best],
        trend=trend[rows, best],
        alpha=GRID_ALPHA[best],
        beta=GRID_BETA[best],
        phi=GRID_PHI[best],
        sigma=sigma,
    )


def holt_forecast(fit: HoltFit, steps: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Point forecast and its standard error for 1..steps ahead; both shape ``(B, steps)``.

    The variance is the ETS(A,Ad,N) one: ``sigma^2 * (1 + sum_{j<h} (alpha + beta*phi_j)^2)``
    with ``phi_j = phi + ... + phi^j``.
    """
    h = np.arange(1, steps + 1, dtype=np.float64)[None, :]
    phi = fit.phi[:, None]
    phi_pow = phi**h
    phi_cum = np.cumsum(phi_pow, axis=1)  # phi_h = phi + ... + phi^h
    point = fit.level[:, None] + phi_cum * fit.trend[:, None]
    incr = (fit.alpha[:, None] + fit.beta[:, None] * phi_cum) ** 2
    var_mult = 1.0 + np.concatenate([np.zeros((incr.shape[0], 1)), np.cumsum(incr, axis=1)[:, :-1]], axis=1)
    se = fit.sigma[:, None] * np.sqrt(var_mult)
    return point, se
