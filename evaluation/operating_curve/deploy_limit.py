"""The limit that knows the deploy time: Wald's SPRT from the version's first request with the true
null (half budget) and defect shares, its bound ln(1/alpha) for `alpha` false alarms per deploy
(Ville's inequality) over the start test's span, then Page's CUSUM with the true rates at the
bank's per-day rate (deciders.Limit's threshold); a defect that starts mid-life meets the CUSUM
started at its onset, as the operating curve's limit. Exact counts (a histogram), 1 s steps."""
from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from detectors.sequential.bank import page
from detectors.sequential.thresholds import Promise, single_threshold


def sprt_first(slow: NDArray[np.float64], requests: NDArray[np.float64], null: float, alternative: float,
               alpha: float) -> NDArray[np.float64]:
    """Per row [R x T], the first step count (1-based seconds) where the SPRT's log-likelihood ratio
    reaches ln(1/alpha) (inf: never in the columns)."""
    llr = np.cumsum(slow * math.log(alternative / null) - requests * (alternative - null), axis=1)
    hit = llr >= math.log(1.0 / alpha)
    return np.where(hit.any(axis=1), np.argmax(hit, axis=1) + 1.0, math.inf)


def cusum_first(slow: NDArray[np.float64], requests: NDArray[np.float64], null: float, alternative: float,
                promise: Promise, requests_per_step: float, after: int = 0) -> NDArray[np.float64]:
    """Per row, the first step count (1-based, from column 0) where Page's CUSUM with the true rates,
    started at zero at column `after` (the onset: as the operating curve's limit), reaches its
    threshold for `promise` (inf: never)."""
    h = single_threshold(null, alternative, promise, requests_per_step)
    s, _ = page(slow[:, after:] * math.log(alternative / null) - requests[:, after:] * (alternative - null))
    hit = s >= h
    return np.where(hit.any(axis=1), np.argmax(hit, axis=1) + 1.0 + after, math.inf)


def deploy_limit(slow: NDArray[np.float64], requests: NDArray[np.float64], null: float, alternative: float,
                 alpha: float, span: int, promise: Promise, requests_per_step: float,
                 onset: int = 0) -> NDArray[np.float64]:
    """Seconds from the deploy (column 0) to the limit's first alarm at or after `onset`: the SPRT
    over the first `span` columns (when the defect is there from the deploy), else the CUSUM."""
    cusum = cusum_first(slow, requests, null, alternative, promise, requests_per_step, onset)
    if onset > 0:
        return cusum
    sprt = sprt_first(slow[:, :span], requests[:, :span], null, alternative, alpha)
    return np.minimum(sprt, cusum)
