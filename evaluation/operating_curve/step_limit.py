"""The limit on latency counters at short steps: Page's CUSUM that knows the true rates but sees
only whether each step holds a request above the line.

A latency counter and a request counter show a step's latency mass. Where a slow request's size
is unknown (a healthy tail may be far heavier than the line), two slow requests in one step read
as one slow request twice the size, so whether a step holds one is all a step can say about the
count. The exact-count limit (deciders.Limit) sees more than counters can show; this one is the
best any test on 1 s counters can do at the same false-alarm rate. The gap between the two is
what the evidence costs (physics); the gap between this limit and the detector is the test's.

The threshold is set for the promise by the CUSUM's run length on a fine grid (a Markov chain
over the statistic: a step holds one with probability p0 = 1 - exp(-null x requests), the
statistic rises by ln(p1/p0) or falls by ln((1-p1)/(1-p0))).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import csr_matrix, identity
from scipy.sparse.linalg import spsolve

from detectors.sequential.step_likelihood import CERTAIN
from detectors.sequential.thresholds import Promise
from evaluation.operating_curve.arrivals import Steps
from evaluation.operating_curve.deciders import Clocked, Tailguard, _Clock

GRID_CELLS = 1500
"""Cells of the statistic's grid below the threshold: fine enough that a step's fall (about
0.18 nats at 40 req/s) spans dozens of cells at every threshold met here."""


def step_rates(null: float, alternative: float, requests_per_step: float) -> tuple[float, float]:
    """P(a step holds a request above the line) under the null and the alternative (at most
    CERTAIN: a large regression at hundreds of requests a step holds one all but surely)."""
    return -math.expm1(-null * requests_per_step), min(-math.expm1(-alternative * requests_per_step), CERTAIN)


def run_length(h: float, p0: float, p1: float, cells: int = GRID_CELLS) -> float:
    """Steps from zero until the CUSUM on step indicators reaches `h`, on average under p0."""
    up, down = math.log(p1 / p0), math.log((1.0 - p1) / (1.0 - p0))
    width = h / cells
    i = np.arange(cells)
    low = np.maximum(i + int(round(down / width)), 0)
    high = i + int(round(up / width))
    inside = high < cells
    rows = np.concatenate([i, i[inside]])
    cols = np.concatenate([low, high[inside]])
    probs = np.concatenate([np.full(cells, 1.0 - p0), np.full(int(inside.sum()), p0)])
    q = csr_matrix((probs, (rows, cols)), shape=(cells, cells))
    x = spsolve((identity(cells, format="csr") - q).tocsc(), np.ones(cells))
    return float(x[0])


@lru_cache(maxsize=64)
def step_threshold(null: float, alternative: float, steps: float, requests_per_step: float) -> float:
    """The least threshold whose run length under the null is at least `steps` (to 0.01 nats)."""
    p0, p1 = step_rates(null, alternative, requests_per_step)
    lo, hi = 0.0, math.log(p1 / p0)
    while run_length(hi, p0, p1) < steps:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 0.01:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if run_length(mid, p0, p1) < steps else (lo, mid)
    return hi


@dataclass(frozen=True)
class StepLimit:
    """The limit on counters: Page's CUSUM of the true rates on whether each step holds one."""

    null: float
    alternative: float
    promise: Promise
    requests_per_step: float

    name: str = "limit on counters' steps"

    @property
    def threshold(self) -> float:
        return step_threshold(self.null, self.alternative, self.promise.steps, self.requests_per_step)

    def start(self, rows: int) -> "StepLimitRun":
        return StepLimitRun(self.null, self.alternative, self.threshold, _Clock(rows, self.promise.step_seconds))


@dataclass
class StepLimitRun(Clocked):
    null: float
    alternative: float
    h: float
    clock: _Clock
    statistic: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    def feed(self, steps: Steps) -> None:
        """Each step's increment at its own traffic (a diurnal trace's steps differ)."""
        holds = steps.above > 0
        n = np.maximum(np.nan_to_num(steps.requests), 1e-9)
        p0, p1 = -np.expm1(-self.null * n), np.minimum(-np.expm1(-self.alternative * n), CERTAIN)
        rise, fall = np.log(p1 / p0), np.log((1.0 - p1) / (1.0 - p0))
        if self.statistic.size != holds.shape[0]:
            self.statistic = np.zeros(holds.shape[0])
        s = self.statistic
        for c in range(holds.shape[1]):
            s = np.maximum(s + np.where(holds[:, c], rise[:, c], fall[:, c]), 0.0)
            hit = np.flatnonzero(s >= self.h)
            if hit.size:
                self.clock.record(hit, np.full(hit.size, self.clock.column + c, dtype=np.int64))
                s[hit] = 0.0  # a rolled-back version starts a new test
        self.statistic = s
        self.clock.column += holds.shape[1]


@dataclass(frozen=True)
class HeldStepsBank(Tailguard):
    """The counters' bank (`design`: the count design, on held steps) fed whether each step truly
    holds a request above the line: counters counted without a miss or a false count. Between the
    limit on steps and it is what not knowing the regression's size costs (the bank); between it
    and the counters row, what reading a step's latency mass costs (the counting)."""

    @property
    def name(self) -> str:
        return "bank on held steps"


__all__ = ["HeldStepsBank", "StepLimit", "StepLimitRun", "run_length", "step_rates", "step_threshold"]
