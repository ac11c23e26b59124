"""What a bank of CUSUMs tests: the null share of requests above the line its false-alarm rate is
stated at, and the regressions (each a multiple of the budget) its members are quickest on."""
from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_SIZES = (2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
"""Regressions as multiples of the budget (P99.9: 0.2% to 10% of requests above the line), a 1-2-5
series: a regression between two members is detected at >= 90% of the efficiency of a member made
for it (docs/detectors.md, "The test: a bank of CUSUMs")."""

MEMBER_RATE_SHARE = 4.0
"""Each member runs at 1/4 of the bank's stated rate, not 1/6: their false alarms overlap (a burst
that trips one member mostly trips its neighbour too), so six of them together alarm at 3-3.5
times one member's rate, measured over simulated version-days at 4, 40 and 400 req/s (the union
bound, 1/6 each, would hold too, at ~0.4 nats more threshold and ~3% more delay). The operating
curve benchmark checks the bank's rate at every traffic level."""


@dataclass(frozen=True)
class BankDesign:
    """A bank of Page CUSUMs on the share of requests above the line.

    Member j tests the null share `null` against `ratios[j] x null`: a slow request (or, with
    latency mass, one request's worth of latency above the line) adds ln(ratios[j]), every
    request removes null x (ratios[j] - 1): the Poisson log-likelihood ratio of the step."""

    null: float
    ratios: tuple[float, ...]
    lump: float = 1.0
    """What one event of the null weighs, in units: 1 for counted requests; for latency mass, the
    heaviest slow request the promise covers (2: up to twice the line). Mass cannot tell one
    request at 2L from two at L, and lumpier evidence of the same mean alarms more often, so the
    thresholds are derived for null events this heavy (arriving at null / lump per request)."""

    per_step: bool = False
    """The evidence says only whether a step holds a request above the line (latency counters
    counted per step): each member reads a step by its Bernoulli likelihood (step_likelihood.py),
    not as a Poisson count."""

    def __post_init__(self) -> None:
        if not 0.0 < self.null < 1.0:
            raise ValueError(f"null share {self.null} is not in (0, 1)")
        if not self.ratios or any(r <= 1.0 for r in self.ratios):
            raise ValueError(f"every ratio must be above 1: {self.ratios}")
        if self.lump < 1.0:
            raise ValueError(f"lump {self.lump} is below one unit")
        if self.per_step and self.lump != 1.0:
            raise ValueError("a design on whether steps hold a request above the line counts requests (lump 1)")

    @classmethod
    def for_budget(cls, budget: float, null_share: float = 0.5, sizes: tuple[float, ...] = DEFAULT_SIZES,
                   lump: float = 1.0, per_step: bool = False) -> "BankDesign":
        """The bank for a budget (P99.9: 0.001 of requests above the line) stated at `null_share`
        of it (half budget by default) in requests, each weighing up to `lump` units, quickest on
        regressions of `sizes` x budget (in units); `per_step`: on whether each step holds one."""
        null = budget * null_share * lump
        return cls(null, tuple(size * budget / null for size in sizes), lump, per_step)

    @property
    def chain_jumps(self) -> tuple[float, ...]:
        """What one null event adds to each member: a lump of units."""
        return tuple(self.lump * j for j in self.jumps)

    @property
    def events(self) -> float:
        """Null events per request (requests above the line at the null)."""
        return self.null / self.lump

    def exponents(self) -> tuple[float, ...]:
        """Per member, theta with E[exp(theta S-step)] = 1 under the null (Lundberg): 1 when the
        evidence comes in single units (the increments are then the true log-likelihood ratio);
        below 1 for lumps. A cycle from zero reaches h with probability at most exp(-theta h)."""
        if self.per_step:  # each step's exact likelihood ratio: E[exp(increment)] = 1 under the null
            return tuple(1.0 for _ in self.ratios)
        out = []
        for r, drain in zip(self.ratios, self.drains):
            def gap(theta: float) -> float:
                return float(self.events * (r ** (self.lump * theta) - 1.0) - theta * drain)
            lo, hi = 1e-6, 1.0
            while gap(hi) < 0:
                hi *= 2.0
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
            out.append(lo)
        return tuple(out)

    @property
    def jumps(self) -> tuple[float, ...]:
        """What one request above the line adds to each member, in nats."""
        return tuple(math.log(r) for r in self.ratios)

    @property
    def drains(self) -> tuple[float, ...]:
        """What one request removes from each member, in nats."""
        return tuple(self.null * (r - 1.0) for r in self.ratios)
