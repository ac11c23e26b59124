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
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from detectors.sequential.design import BankDesign

START_ALPHA = 0.001
"""The start test's false-verdict probability per canary start."""
SERVED_CHANCE = 1e-6
"""A first request inside the lookback is the canary's start only when the stable served so many
requests before it that a canary already serving at its weight would have got none of them with at
most this chance (a slow canary's gap between requests is not a start)."""


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


def crossing_probability(design: BankDesign, bound: float, requests_per_step: float, steps: int) -> float:
    """P(under the null, some member's life statistic reaches `bound` within `steps` steps of
    `requests_per_step` requests each), counted requests: the units so far are a Poisson count,
    and a member reaches the bound once the count reaches (bound + drain x requests) / jump, so
    'any member' is the count reaching the lowest of those lines: one recursion over the count."""
    n = requests_per_step
    t = np.arange(1, steps + 1, dtype=np.float64)
    lines = (bound + np.asarray(design.drains)[:, None] * n * t[None, :]) / np.asarray(design.jumps)[:, None]
    need = np.ceil(lines.min(axis=0) - 1e-9).astype(np.int64)  # units that cross at each step
    top = int(need.max())
    mean = design.null * n
    k = np.arange(top + 1)
    pmf = np.exp(k * math.log(mean) - mean - np.array([math.lgamma(x + 1.0) for x in k])) if mean > 0 else (k == 0) * 1.0
    alive = np.zeros(top + 1)
    alive[0] = 1.0
    for step in range(steps):
        alive = np.convolve(alive, pmf)[: top + 1]  # what runs past `top` has crossed
        alive[need[step]:] = 0.0
    return 1.0 - float(alive.sum())


@lru_cache(maxsize=1024)
def start_thresholds(design: BankDesign, alpha: float, requests_per_step: float, steps: int) -> tuple[float, ...]:
    """Per member, the start test's bound: for counted requests the least one bound (the same for
    every member) whose `crossing_probability` over the lookback is at most `alpha` at this traffic
    (at the top of its traffic cell: more requests per step only raise it), found by bisection
    below the Ville bound; for latency mass (lumps) the Ville bound."""
    loose = ville_thresholds(design, alpha)
    if design.lump != 1.0 or requests_per_step <= 0 or steps <= 0:
        return loose
    lo, hi = 0.0, max(loose)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if crossing_probability(design, mid, requests_per_step, steps) > alpha else (lo, mid)
    return tuple(hi for _ in design.ratios)


def start_statistic(design: BankDesign, units: float, requests: float) -> NDArray[np.float64]:
    """Per member, the log-likelihood ratio of the canary's life: its requests above the line
    (units) and its requests, against the design's null."""
    return np.asarray(units * np.asarray(design.jumps) - requests * np.asarray(design.drains), dtype=np.float64)
