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
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.sparse.linalg import spsolve
from scipy.stats import poisson

from detectors.sequential.step_likelihood import held_rise

RESOLUTION = 60  # cells per jump: run lengths within ~10% of a 200-cell grid (the test)
MAX_CELLS = 40_000  # a grid this large solves in well under a second
TRUSTED = 1e13  # past this the system is too ill-conditioned to tell values apart: "long enough"
MOVE_FLOOR = 1e-15  # a step's move rarer than this is left out of the chain
SPREAD_SD = 4.0  # a step's requests are solved over this many standard deviations about their mean
LATTICE_DRAIN = 0.5  # a member whose step drains at least this share of a count is solved over the requests' spread


def run_length(threshold: float, jump: float, drain: float, mean: float, resolution: int = RESOLUTION,
               requests: float | None = None, per_step: bool = False) -> float:
    """Expected steps from S = 0 until S >= threshold (math.inf: beyond what can be told apart).

    Args:
        threshold: h, > 0.
        jump: what one count adds (ln r for a rate ratio r), > 0.
        drain: what every step removes (expected null count x (r - 1)), >= 0.
        mean: the expected count per step under the rate the run length is for, >= 0.
        requests: when given, the requests a step holds vary, Poisson with this mean, and `drain`
            and `mean` are the step's at that mean: a step of n requests drains drain x n / requests
            and counts Poisson(mean x n / requests). A member made for a large regression crosses
            on one step's count (its drain many jumps), and where a step's requests are fewer than
            the mean that count crosses far more often: the live evidence's steps vary so.
        per_step: the evidence is whether a step holds a count (step_likelihood.py): a step holds
            one with probability 1 - exp(-mean) and then rises by its likelihood ratio plus the
            drain, at the traffic `drain` is for (`jump` = ln r, `drain` = that traffic's null
            count x (r - 1)).
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
    if requests is not None and drain < LATTICE_DRAIN * jump:
        # A count takes several steps to drain: over them the requests' spread averages out and
        # the run length is the mean's (what varies it is the lattice, one step deciding). Solved
        # at the mean, whose smaller band also solves far faster.
        requests = None
    moves, weights = _moves(jump / cell, drain / cell, mean, requests, jump if per_step else None)
    # Every state rises by the same steps (a count's cells less the drain's): one rise per step at
    # most this often means a run of more than 1 / that many steps, beyond TRUSTED "long enough".
    # A busy member made for a large regression (its drain many jumps, a crossing needs a count of
    # 20 where 1 is expected) cannot rise at all on the moves kept: its system is singular, not
    # solvable (SuperLU's NaN and a MatrixRankWarning); its run length is beyond what we tell apart.
    if float(weights[moves > 0].sum()) * TRUSTED < 1.0:
        return math.inf
    state = np.arange(cells)
    dest = np.maximum(state[None, :] + moves[:, None], 0)  # [move x state]
    inside = dest < cells
    rows = np.broadcast_to(state[None, :], dest.shape)[inside]
    vals = np.broadcast_to(weights[:, None], dest.shape)[inside]
    q = sparse.csc_matrix((vals, (rows, dest[inside])), shape=(cells, cells))
    system = (sparse.identity(cells, format="csc") - q).tocsc()
    with np.errstate(all="ignore"):
        steps = spsolve(system, np.ones(cells))
    first = float(steps[0])
    if not math.isfinite(first) or first <= 0 or first > TRUSTED:
        return math.inf
    return first


@lru_cache(maxsize=256)
def _moves(up: float, down: float, mean: float, requests: float | None,
           step_jump: float | None = None) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """The chain's moves per step in cells and their probabilities: a count of c rises round(c x up)
    cells (`step_jump`, the member's ln r, given: at most one held step, rising by its likelihood
    ratio plus the drain), and the drain (`down` cells, rarely whole) moves to its two neighbouring
    whole counts with the weights that keep its mean exact; over a step's requests when they vary.
    The same for every threshold a search tries (cached; callers do not change the arrays)."""
    if requests is None or requests <= 0:
        ns, pn = np.array([1.0]), np.array([1.0])
    else:
        # Requests within SPREAD_SD standard deviations of the mean, each tail's mass put on the
        # range's edge (the rows must sum to one: mass left out would read as a crossing). Wider
        # costs the solve its band's square and moves no threshold measurably.
        sd = math.sqrt(requests)
        lo, hi = max(0, int(requests - SPREAD_SD * sd)), int(requests + SPREAD_SD * sd) + 1
        k = np.arange(lo, hi + 1)
        pk = poisson.pmf(k, requests)
        pk[0] += poisson.cdf(lo - 1, requests)
        pk[-1] += poisson.sf(hi, requests)
        keep = pk > 1e-18
        ns, pn = k[keep] / requests, pk[keep]  # a step's requests, as a share of the mean
    dn = down * ns
    if step_jump is None:
        top = int(poisson.isf(1e-16, mean * float(ns.max()))) + 2
        counts = np.arange(top + 1)
        w = pn[:, None] * poisson.pmf(counts[None, :], mean * ns[:, None])  # [share x count]
        rise = np.broadcast_to(np.round(counts * up).astype(np.int64), w.shape)
        low = np.floor(dn).astype(np.int64)[:, None]
        frac = (dn - np.floor(dn))[:, None]
        # Dense enough counts only: what is rarer than 1e-18 per step moves no run length we can tell.
        keep = w > 1e-18
        moves = np.concatenate([(rise - low)[keep], (rise - low - 1)[keep]])
        weights = np.concatenate([(w * (1.0 - frac))[keep], (w * frac)[keep]])
    else:
        cell = step_jump / up
        ratio = math.exp(step_jump)
        held = -np.expm1(-mean * ns)
        w = pn[:, None] * np.stack([1.0 - held, held], axis=1)  # [share x (not held, held)]
        # A held step's rise at the drain's traffic (a step of fewer requests rises more: the chain
        # dominates the live steps); every move, rarely a whole number of cells, goes to its two
        # neighbouring cell counts with the weights that keep its mean exact, as the drain does.
        nats = held_rise(down * cell / (ratio - 1.0), ratio, ns)
        x = np.stack([-dn, nats / cell - dn], axis=1)
        low = np.floor(x)
        frac = x - low
        keep = w > 1e-18
        moves = np.concatenate([low[keep], low[keep] + 1.0]).astype(np.int64)
        weights = np.concatenate([(w * (1.0 - frac))[keep], (w * frac)[keep]])
    distinct, where = np.unique(moves, return_inverse=True)
    summed: NDArray[np.float64] = np.bincount(where, weights=weights).astype(np.float64)
    steps_moved: NDArray[np.int64] = distinct.astype(np.int64)
    # Moves rarer than MOVE_FLOOR a step change no run length this solves (at most TRUSTED steps,
    # and a member's promise is well under 1e9 steps): left out, they only thin the system.
    used = summed > MOVE_FLOOR
    return steps_moved[used], summed[used]


def threshold_for(steps: float, jump: float, drain: float, mean: float, resolution: int = RESOLUTION,
                  hint: float | None = None, requests: float | None = None, per_step: bool = False) -> float:
    """The smallest threshold (to ~0.02 nats, plus two grid cells of margin) whose run length is
    at least `steps`: the CUSUM's h for one false alarm per `steps` steps.

    ln(run length) grows about linearly in h, so secant steps find it in a few solves; with large
    jumps the run length is a staircase in h, where a bisection over the bracket the secant steps
    found finishes. `hint`: a first guess (a threshold for a nearby rate or traffic); `requests`:
    a step's requests vary, Poisson with this mean; `per_step`: on held steps (`run_length`)."""
    if mean <= 0 or steps <= 1:
        return jump  # no traffic: nothing can accumulate; one count is all it would take
    target = math.log(steps)
    lo, hi = 0.0, math.inf  # run_length(lo) < steps <= run_length(hi)
    h = max(0.05, hint) if hint is not None else max(jump, target - 2.0)
    prev: tuple[float, float] | None = None
    for _ in range(8):
        value = run_length(h, jump, drain, mean, resolution, requests, per_step)
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
        if run_length(h, jump, drain, mean, resolution, requests, per_step) >= steps:
            hi = h
        else:
            lo = h
    while hi - lo > 0.02 and run_length(hi - 0.02, jump, drain, mean, resolution, requests, per_step) >= steps:
        # A staircase: a lower threshold may hold the rate too; bisect down to the step's edge.
        mid = 0.5 * (lo + hi)
        if run_length(mid, jump, drain, mean, resolution, requests, per_step) >= steps:
            hi = mid
        else:
            lo = mid
    # Near a step of the staircase the grid can land on the wrong side of it: two cells more.
    return hi + 2.0 * jump / resolution
