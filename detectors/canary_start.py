"""The canary judge's start test: while a canary's whole life is inside the lookback, its evidence
since its first request is one likelihood ratio per bank member against the stable's reference,
never reset, read against a bound that holds over every look at once.

Why: the running bank guards a version for as long as it serves, at a stated rate per version-day,
so its thresholds are those of a CUSUM that must stay quiet for 30 days (h ~ 13-15 nats). A canary's
start is one event per version: a test of its life so far spends a fixed false-alarm probability
per start, however often it is looked at (Ville's inequality for the likelihood ratio), at about
ln(members / alpha) ~ 6 nats. That is what a rank test on per-minute quantiles exploits at low
canary traffic (a canary at 4 req/s with 0.5% of requests slow is judged in minutes, not in the
bank's five); here it is done on the requests themselves, at a stated probability.

The stated rate is split: the start test spends START_ALPHA per canary start (the policy's
`start_false_verdicts`), the running bank what is left of a version-day's share, so a version that
starts at most once a day keeps the single-version promise. Why so small a share: canaries start
often (a team rolling out ten a day at 1/60 per start would see a false rollback every six days),
and a benchmark of 160 healthy canary starts should shift none.

The bound is derived per cell (`start_cell`): the design (its null already on the judge's 10%
reference grid), the traffic on the threshold store's 1% grid and the horizon on a 9% grid, each
rounded the way that only raises the crossing probability, so one cell's bound holds for every
value in it. The live judge asks the process's threshold store for it (`live_start_thresholds`):
derived by its worker thread, never on the event loop; until then Ville's bound, which holds at any
traffic and horizon.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from detectors.sequential.design import BankDesign
from detectors.sequential.thresholds import STORE, TRAFFIC_GRID

START_ALPHA = 0.001
"""The start test's false-verdict probability per canary start."""
SERVED_CHANCE = 1e-6
"""A first request inside the lookback is the canary's start only when the stable served so many
requests before it that a canary already serving at its weight would have got none of them with at
most this chance (a slow canary's gap between requests is not a start)."""
HORIZON_GRID = 2.0 ** 0.125
"""The start bound's horizon is rounded up to a power of this (9%; one of the lookback's doublings in
8 cells): a window one step longer than the last is the same cell."""
PMF_TAIL = 1e-18
"""A step's Poisson count is cut where its tail is below this; what is cut counts as crossed (the
bound a hair higher, never lower), and a step costs its few likely counts, not the whole range."""
TOLERANCE = 1e-3
"""The bisection stops with the bound bracketed this closely (nats) and answers the bracket's top:
at most this much above the least bound, never below it."""


def start_alpha(promise_days: float, wanted: float = START_ALPHA) -> float:
    """The start test's false-verdict probability per canary start: `wanted`, at most half of what
    the stated rate allows a version-day."""
    return min(wanted, 0.5 / promise_days)


def bank_days(promise_days: float, alpha: float) -> float:
    """The running bank's promise, one false alarm per this many version-days: what the stated rate
    leaves a version-day once its start has spent `alpha`."""
    return promise_days / (1.0 - promise_days * alpha)


def life_start(canary_requests: NDArray[np.float64], stable_requests: NDArray[np.float64],
               weight: float) -> int | None:
    """The step of the canary's first request when its life began inside the lookback: the stable
    served enough requests before it (SERVED_CHANCE at the canary's `weight`, a fraction); None
    when the canary had none, or may have served before the lookback."""
    if not 0.0 < weight < 1.0:
        return None
    got = np.flatnonzero(np.nan_to_num(canary_requests) > 0)
    if not got.size:
        return None
    first = int(got[0])
    before = float(np.nansum(stable_requests[:first]))
    return first if before >= math.log(SERVED_CHANCE) / math.log1p(-weight) else None


def ville_thresholds(design: BankDesign, alpha: float) -> tuple[float, ...]:
    """Per member, ln(members / alpha) / theta: under the null exp(theta S) is a nonnegative
    supermartingale from one (theta the member's Lundberg exponent, 1 for counted requests), so it
    ever reaches members / alpha with probability at most alpha / members (Ville); over the members,
    alpha, at any traffic and for as long as the test runs. Loose: the union over members that move
    together, and the overshoot of a jump of ln(ratio) nats past the bound, are not spent."""
    bound = math.log(len(design.ratios) / alpha)
    return tuple(bound / theta for theta in design.exponents())


def crossing_probability(design: BankDesign, bound: float, requests_per_step: float, steps: int,
                         drained_per_step: float | None = None) -> float:
    """P(under the null, some member's life statistic reaches `bound` within `steps` steps of
    `requests_per_step` requests each), counted requests: the units so far are a Poisson count,
    and a member reaches the bound once the count reaches (bound + drain x requests) / jump, so
    'any member' is the count reaching the lowest of those lines: one recursion over the count.
    `drained_per_step`: the requests the drain is counted on, when not the arrivals' (a cell's
    bottom beside its top: `cell_thresholds`)."""
    n = requests_per_step
    drained = n if drained_per_step is None else drained_per_step
    t = np.arange(1, steps + 1, dtype=np.float64)
    lines = (bound + np.asarray(design.drains)[:, None] * drained * t[None, :]) / np.asarray(design.jumps)[:, None]
    need = np.maximum(np.ceil(lines.min(axis=0) - 1e-9), 0).astype(np.int64)  # units that cross at each step
    top = int(need.max())
    pmf = _step_pmf(design.null * n, top)
    alive = np.zeros(top + 1)
    alive[0] = 1.0
    for step in range(steps):
        alive = np.convolve(alive, pmf)[: top + 1]  # what runs past `top` has crossed
        alive[need[step]:] = 0.0
    return max(0.0, 1.0 - float(alive.sum()))


def _step_pmf(mean: float, top: int) -> NDArray[np.float64]:
    """P(k) of one step's Poisson count for k up to `top`, cut where the rest is below PMF_TAIL."""
    if mean <= 0:
        return np.ones(1)
    last = min(top, int(mean + 12.0 * math.sqrt(mean) + 40.0))
    k = np.arange(last + 1, dtype=np.float64)
    pmf: NDArray[np.float64] = np.exp(k * math.log(mean) - mean - np.array([math.lgamma(x + 1.0) for x in k.tolist()]))
    tail = 1.0 - np.cumsum(pmf)
    return pmf[: int(np.argmax(tail < PMF_TAIL)) + 1] if (tail < PMF_TAIL).any() else pmf


def start_cell(requests_per_step: float, steps: int) -> tuple[int, int]:
    """The cell of a traffic and a horizon: the exponents of their tops on TRAFFIC_GRID (the threshold
    store's, so a traffic and its `rounded_traffic` share a cell) and HORIZON_GRID."""
    traffic = math.ceil(math.log(requests_per_step) / math.log(TRAFFIC_GRID) - 1e-9)
    return traffic, math.ceil(math.log(steps) / math.log(HORIZON_GRID) - 1e-9)


def start_thresholds(design: BankDesign, alpha: float, requests_per_step: float, steps: int) -> tuple[float, ...]:
    """Per member, the start test's bound at `requests_per_step` over `steps`: its cell's
    (`cell_thresholds`, computed here if need be: the replay, tests); for latency mass (lumps), or
    without traffic, the Ville bound."""
    if design.lump != 1.0 or requests_per_step <= 0 or steps <= 0 or alpha <= 0:
        return ville_thresholds(design, alpha)
    return cell_thresholds(design, alpha, *start_cell(requests_per_step, steps))


def live_start_thresholds(design: BankDesign, alpha: float, requests_per_step: float,
                          steps: int) -> tuple[tuple[float, ...], bool]:
    """(bound, derived): `start_thresholds` as the live judge reads it, never derived in the
    caller's thread: a cell not derived yet is queued on the process's threshold store and answers
    the Ville bound (it holds at any traffic and horizon, looser) until its worker has it."""
    if design.lump != 1.0 or requests_per_step <= 0 or steps <= 0 or alpha <= 0:
        return ville_thresholds(design, alpha), True
    cell = start_cell(requests_per_step, steps)
    return STORE.cell(("canary start", design, alpha, *cell), lambda: cell_thresholds(design, alpha, *cell),
                      lambda: ville_thresholds(design, alpha))


@lru_cache(maxsize=1024)
def cell_thresholds(design: BankDesign, alpha: float, traffic_cell: int, horizon_cell: int) -> tuple[float, ...]:
    """Per member (one shared value), the least bound whose `crossing_probability` is at most
    `alpha` for every traffic and horizon of the cell, found by bisection below the Ville bound."""
    # Conservative: counts arrive at the cell's top traffic, drains at its bottom and the horizon is its top, and
    # each only raises the chance of a crossing (fewer counts, more drain and fewer looks only lower it).
    top, bottom = TRAFFIC_GRID ** traffic_cell, TRAFFIC_GRID ** (traffic_cell - 1)
    steps = math.ceil(HORIZON_GRID ** horizon_cell - 1e-6)
    lo, hi = 0.0, max(ville_thresholds(design, alpha))
    while hi - lo > TOLERANCE:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if crossing_probability(design, mid, top, steps, bottom) > alpha else (lo, mid)
    return tuple(hi for _ in design.ratios)


def start_statistic(design: BankDesign, units: float, requests: float) -> NDArray[np.float64]:
    """Per member, the log-likelihood ratio of the canary's life: its requests above the line
    (units) and its requests, against the design's null."""
    return np.asarray(units * np.asarray(design.jumps) - requests * np.asarray(design.drains), dtype=np.float64)
