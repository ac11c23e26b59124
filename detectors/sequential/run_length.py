"""How long a Poisson CUSUM runs before a false alarm, from its Markov chain: the number that turns
a stated false-alarm rate into a threshold.

The statistic S = max(0, S + jump x c - drain) with c ~ Poisson(mean) per step is a Markov chain.
On a grid of cells jump / RESOLUTION wide (a jump is exactly RESOLUTION cells; the drain, rarely a
whole number of cells, moves to its two neighbouring cell counts with the weights that keep its mean
exact) the expected number of steps from S = 0 to S >= threshold solves one sparse linear system
(Brook and Evans, 1972). Checked against simulation in tests/unit/test_run_length.py.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import spsolve
from scipy.stats import poisson

RESOLUTION = 60  # cells per jump: run lengths within ~10% of a 200-cell grid (the test)
MAX_CELLS = 40_000  # a grid this large solves in well under a second
TRUSTED = 1e13  # past this the system is too ill-conditioned to tell values apart: "long enough"


def run_length(threshold: float, jump: float, drain: float, mean: float, resolution: int = RESOLUTION) -> float:
    """Expected steps from S = 0 until S >= threshold (math.inf: beyond what can be told apart).

    Args:
        threshold: h, > 0.
        jump: what one count adds (ln r for a rate ratio r), > 0.
        drain: what every step removes (expected null count x (r - 1)), >= 0.
        mean: the expected count per step under the rate the run length is for, >= 0.
    """
    if mean <= 0:
        return math.inf
    cell = jump / resolution
    cells = int(math.ceil(threshold / cell))
    if cells < 1:  # S >= 0 holds at the first step
        return 1.0
    if cells > MAX_CELLS:  # a finer grid than we solve: coarsen (the drain split keeps the mean)
        cell = threshold / MAX_CELLS
        cells = MAX_CELLS
    up = jump / cell
    down = drain / cell
    low = int(math.floor(down))
    frac = down - low
    top = int(poisson.isf(1e-16, mean)) + 2
    counts = np.arange(top + 1)
    weights = poisson.pmf(counts, mean)
    # Dense enough counts only: what is rarer than 1e-18 per step moves no run length we can tell.
    keep = weights > 1e-18
    counts, weights = counts[keep], weights[keep]
    # Every state rises by the same steps (a count's cells less the drain's): one rise per step at
    # most this often means a run of more than 1 / that many steps, beyond TRUSTED "long enough".
    # A busy member made for a large regression (its drain many jumps, a crossing needs a count of
    # 20 where 1 is expected) cannot rise at all on the counts kept: its system is singular, not
    # solvable (SuperLU's NaN and a MatrixRankWarning); its run length is beyond what we tell apart.
    rise = np.round(counts * up)
    rising = (1.0 - frac) * float(weights[rise > low].sum()) + frac * float(weights[rise > low + 1].sum())
    if rising * TRUSTED < 1.0:
        return math.inf
    state = np.arange(cells)
    rows_l, cols_l, vals_l = [], [], []
    for move, share in ((low, 1.0 - frac), (low + 1, frac)):
        if share <= 0.0:
            continue
        for c, p in zip(counts, weights):
            dest = np.maximum(state - move + int(round(c * up)), 0)
            inside = dest < cells
            rows_l.append(state[inside])
            cols_l.append(dest[inside])
            vals_l.append(np.full(int(inside.sum()), p * share))
    rows, cols = np.concatenate(rows_l), np.concatenate(cols_l)
    vals = -np.concatenate(vals_l)
    q = sparse.csc_matrix((-vals, (rows, cols)), shape=(cells, cells))
    system = (sparse.identity(cells, format="csc") - q).tocsc()
    with np.errstate(all="ignore"):
        steps = spsolve(system, np.ones(cells))
    first = float(steps[0])
    if not math.isfinite(first) or first <= 0 or first > TRUSTED:
        return math.inf
    return first


def threshold_for(steps: float, jump: float, drain: float, mean: float, resolution: int = RESOLUTION,
                  hint: float | None = None) -> float:
    """The smallest threshold (to ~0.02 nats, plus two grid cells of margin) whose run length is
    at least `steps`: the CUSUM's h for one false alarm per `steps` steps.

    ln(run length) grows about linearly in h, so secant steps find it in a few solves; with large
    jumps the run length is a staircase in h, where a bisection over the bracket the secant steps
    found finishes. `hint`: a first guess (a threshold for a nearby rate or traffic)."""
    if mean <= 0 or steps <= 1:
        return jump  # no traffic: nothing can accumulate; one count is all it would take
    target = math.log(steps)
    lo, hi = 0.0, math.inf  # run_length(lo) < steps <= run_length(hi)
    h = max(0.05, hint) if hint is not None else max(jump, target - 2.0)
    prev: tuple[float, float] | None = None
    for _ in range(8):
        value = run_length(h, jump, drain, mean, resolution)
        logged = math.log(value) if math.isfinite(value) else math.inf
        if value >= steps:
            hi = min(hi, h)
            if logged - target < 0.02:
                break
        else:
            lo = max(lo, h)
        slope = 1.0
        if prev is not None and math.isfinite(logged) and math.isfinite(prev[1]) and h != prev[0]:
            slope = (logged - prev[1]) / (h - prev[0])
        prev = (h, logged)
        step = (target - logged) / slope if math.isfinite(logged) and slope > 0.05 else -0.5 * (h - lo)
        proposal = h + step + (0.01 if step > 0 else -0.01)
        if not lo < proposal < hi:  # outside the bracket (or no bracket yet): halve or grow
            proposal = 0.5 * (lo + hi) if math.isfinite(hi) else 2.0 * h + jump
        if proposal > 1e4:
            raise ValueError(f"no threshold reaches {steps:g} steps (jump {jump}, drain {drain}, mean {mean})")
        h = proposal
    while not math.isfinite(hi):  # still no threshold long enough: grow until there is
        h = 2.0 * h + jump
        if h > 1e4:
            raise ValueError(f"no threshold reaches {steps:g} steps (jump {jump}, drain {drain}, mean {mean})")
        if run_length(h, jump, drain, mean, resolution) >= steps:
            hi = h
        else:
            lo = h
    while hi - lo > 0.02 and run_length(hi - 0.02, jump, drain, mean, resolution) >= steps:
        # A staircase: a lower threshold may hold the rate too; bisect down to the step's edge.
        mid = 0.5 * (lo + hi)
        if run_length(mid, jump, drain, mean, resolution) >= steps:
            hi = mid
        else:
            lo = mid
    # Near a step of the staircase the grid can land on the wrong side of it: two cells more.
    return hi + 2.0 * jump / resolution
