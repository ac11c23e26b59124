"""The likelihood of a step that says only whether it holds a request above the line: latency
counters counted per step (detectors/_slow_counts.py).

A step of n requests holds one with probability p = 1 - exp(-n x share) (Poisson arrivals of slow
requests). Member j of a bank (share null x r_j against null) adds ln(p1 / p0) for a step that
holds one and ln((1 - p1) / (1 - p0)) = -n x null x (r_j - 1), its drain, for one that does not:
the exact log-likelihood ratio of what the step shows, so two slow requests in one step are in
the promise (they are one held step under the null as under the alternative) and no count of them
is guessed. Where a step rarely holds two (n x share small) ln(p1 / p0) is ln(r_j), a count's jump;
where it often does (a large regression, a busy series) it is less, and the drain is what tells.

Written as the bank's two running sums need it: a held step rises by ln(p1 / p0) plus the drain
(`held_rise`), every step drains.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

CERTAIN = 1.0 - 1e-12  # a step of thousands of requests at a large share holds one all but surely


def held_rise(null: float, ratio: float, requests: NDArray[np.float64]) -> NDArray[np.float64]:
    """What a step of `requests` that holds a request above the line adds to the member of `ratio`
    before its drain: ln(p1 / p0) + requests x null x (ratio - 1); 0 where a step has no requests."""
    n = np.asarray(requests, dtype=np.float64)
    busy = n > 0
    m = np.where(busy, n, 1.0) * null
    p0 = -np.expm1(-m)
    p1 = np.minimum(-np.expm1(-m * ratio), CERTAIN)
    out: NDArray[np.float64] = np.where(busy, np.log(p1 / p0) + m * (ratio - 1.0), 0.0)
    return out


def held_rises(null: float, ratio: float, units: NDArray[np.float64], requests: NDArray[np.float64]
               ) -> NDArray[np.float64]:
    """`held_rise` on the steps whose units say they hold a request above the line (units > 0), 0
    on the others: what the member adds per step before its drain."""
    held = np.asarray(units) > 0
    out = np.zeros(held.shape)
    # Held steps are rare (a few in a hundred): the logarithms on them alone, not on every step.
    out[held] = held_rise(null, ratio, np.asarray(requests, dtype=np.float64)[held])
    return out
