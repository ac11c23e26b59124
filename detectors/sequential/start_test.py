"""The start test: a version's evidence since its first request as one likelihood ratio per bank
member, never reset, read against a bound that holds over every look at once.

Why beside the running bank: the bank guards a version for as long as it serves, at a stated rate
per version-day, so its thresholds are those of a CUSUM that must stay quiet for a month (13-15
nats). A deploy is one event per version: a test of the version's life so far spends a fixed
false-alarm probability per deploy however often it is looked at, at ~ln(members / alpha) nats or
less. Regressions arrive with deploys, so that is where the budget buys the most.

Two bounds, per member, for a per-deploy probability `alpha`:
- Ville's: under the null exp(theta S) is a nonnegative supermartingale from one (theta the
  member's Lundberg exponent: 1 for counted requests, below 1 for latency mass in lumps), so some
  member ever reaches ln(members / alpha) / theta with probability at most alpha: at any traffic,
  for any horizon;
- exact (`start_bounds`): the least common bound whose probability of being reached by some member
  within the horizon, at the version's traffic, is at most alpha. Under the null the units are a
  Poisson count of events each weighing at most the design's lump (one counted request; up to
  `heaviest_slow` requests' worth of latency mass), and a member reaches the bound once the count
  reaches (bound + drain x requests) / (lump x jump): "any member" is the count reaching the lowest
  of those lines, one recursion over the count. Lumps lighter than the design's only lower the
  statistic, so the bound holds for them too.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln

from detectors.sequential.design import BankDesign

START_ALPHA = 0.001
"""The default false-alarm probability per deploy (as the canary judge's per canary start)."""
PMF_TAIL = 1e-18
"""The per-step count's distribution is cut where its tail is below this: what is cut is counted
as crossed (the bound comes out a hair higher, never lower)."""
BOUND_TOLERANCE = 1e-3
"""Nats: the bisection stops within this of the least bound (a thousandth of a nat moves no crossing
measurably; each halving costs a recursion, ~20 ms at 400 req/s)."""
TRAFFIC_MARGIN = 2.0
"""The exact bound holds for up to this many times the requests the horizon brings at the traffic
it is computed for: a version whose traffic rises during its start test (a rollout's weight
stepping up) is still covered; one that more than doubles is covered by Ville's bound only."""


def start_alpha(promise_days: float, wanted: float = START_ALPHA) -> float:
    """The start test's probability per deploy: `wanted`, at most half of what the stated rate
    allows a version-day (a version deployed at most once a day then keeps the promise)."""
    return min(wanted, 0.5 / promise_days)


def bank_days(promise_days: float, alpha: float) -> float:
    """The running bank's promise, one false alarm per this many version-days: what the stated rate
    leaves a version-day once its start has spent `alpha`."""
    return promise_days / (1.0 - promise_days * alpha)


def ville_bounds(design: BankDesign, alpha: float) -> tuple[float, ...]:
    """Per member, ln(members / alpha) / theta: the bound every member may share at any traffic."""
    bound = math.log(len(design.ratios) / alpha)
    return tuple(bound / theta for theta in design.exponents())


def _poisson_pmf(mean: float) -> NDArray[np.float64]:
    """P(k) of a Poisson count with `mean`, cut where the rest is below PMF_TAIL."""
    if mean <= 0:
        return np.ones(1)
    top = int(mean + 12.0 * math.sqrt(mean) + 40.0)
    k = np.arange(top + 1, dtype=np.float64)
    log_pmf = k * math.log(mean) - mean - gammaln(k + 1.0)
    pmf: NDArray[np.float64] = np.exp(log_pmf)
    tail = 1.0 - np.cumsum(pmf)
    keep = int(np.argmax(tail < PMF_TAIL)) + 1 if (tail < PMF_TAIL).any() else pmf.size
    return pmf[:keep]


def crossing_probability(design: BankDesign, bound: float, requests_per_step: float, steps: int) -> float:
    """P(under the null, some member's statistic since the start reaches `bound` at any request
    within the `requests_per_step x steps` requests), events of `design.lump` units each.

    Looked at after every request: a statistic rises only when an event arrives, so this is the
    most any grid of steps can cross, whatever their sizes (live steps hold a Poisson number of
    requests; a recursion that looks only every `requests_per_step` requests misses the crossings
    a small step makes early in a test, ~20% of the rate at 40 req/s). Exact: the events needed at
    request n, min over members of (bound + drain x n) / jump rounded up, is a staircase, and a
    count reaches it somewhere on a stair only if it does at the stair's last request, so the
    recursion looks once per stair."""
    total = requests_per_step * steps
    jumps, drains = np.asarray(design.chain_jumps), np.asarray(design.drains)
    level = int(math.ceil(float((bound / jumps).min()) - 1e-9))
    if level <= 0:
        return 1.0
    if total <= 0 or design.events <= 0:
        return 0.0
    alive = np.ones(1)  # P(count = c, not crossed), c < the current stair's height
    seen = 0.0
    pmfs: dict[float, NDArray[np.float64]] = {}  # one member sets most stairs: equal widths
    while seen < total:
        # The last request at which `level` events are still what crossing needs.
        last = float(((level * jumps - bound) / drains).max()) if (drains > 0).all() else math.inf
        end = min(total, last)
        if end > seen:
            mean = round(design.events * (end - seen), 12)
            pmf = pmfs.get(mean)
            if pmf is None:
                pmf = pmfs[mean] = _poisson_pmf(mean)
            alive = np.convolve(alive, pmf[:level])
            seen = end
        alive = alive[:level]  # what reached `level` events by now has crossed
        level += 1
    return max(0.0, 1.0 - float(alive.sum()))


@lru_cache(maxsize=1024)
def start_bounds(design: BankDesign, alpha: float, requests_per_step: float, steps: int) -> tuple[float, ...]:
    """Per member (one shared value), the least bound whose probability of being reached within
    TRAFFIC_MARGIN x the requests `steps` steps of `requests_per_step` bring is at most `alpha`,
    looked at after every request (`crossing_probability`: no grid of steps crosses more).
    Bisection below Ville's; Ville's when there is no traffic."""
    loose = ville_bounds(design, alpha)
    if requests_per_step <= 0 or steps <= 0 or alpha <= 0:
        return loose
    lo, hi = 0.0, max(loose)
    while hi - lo > BOUND_TOLERANCE:  # ~14 halvings: the bound is kept at the top, never below the least
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if crossing_probability(design, mid, TRAFFIC_MARGIN * requests_per_step, steps) > alpha \
            else (lo, mid)
    return tuple(hi for _ in loose)


def life_statistic(design: BankDesign, units: NDArray[np.float64], requests: NDArray[np.float64]
                   ) -> NDArray[np.float64]:
    """[K x P] each member's log-likelihood ratio since the start after each step, from per-step
    `units` and `requests` [P] (NaN: the step is not scored, it adds nothing)."""
    ok = np.isfinite(units) & np.isfinite(requests)
    cu = np.cumsum(np.where(ok, units, 0.0))
    cn = np.cumsum(np.where(ok, requests, 0.0))
    return np.asarray(np.asarray(design.jumps)[:, None] * cu[None, :]
                      - np.asarray(design.drains)[:, None] * cn[None, :], dtype=np.float64)


def first_crossing(statistic: NDArray[np.float64], bounds: tuple[float, ...]) -> int:
    """The first column where some member reaches its bound (-1: none)."""
    over = (statistic >= np.asarray(bounds)[:, None]).any(axis=0)
    return int(np.argmax(over)) if over.any() else -1


__all__ = ["START_ALPHA", "bank_days", "crossing_probability", "first_crossing", "life_statistic",
           "start_alpha", "start_bounds", "ville_bounds"]
