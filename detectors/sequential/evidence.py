"""What a step tells the test: requests above the line, and requests, per series and step.

Two sources of evidence, one meaning ("requests above L"):
- a histogram with a bucket bound at L counts them exactly: the total's increment minus the
  bucket's (a request at exactly L is not above it);
- latency counters (Triton's) count only latency mass: what a step's latency exceeds over what
  its requests' bulk explains, divided by (L - bulk), is how many requests above L it is worth
  ("slow equivalents"). A 900 ms request counts as 1.8 requests above 500 ms, so mass cannot
  tell 0.05% of requests at 900 ms from 0.09% at 500 ms: its false-alarm rate is stated in mass.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class Evidence:
    """Per step [S x P]: requests above the line (NaN: the step is not scored) and requests."""

    units: NDArray[np.float64]
    requests: NDArray[np.float64]


@dataclass(frozen=True)
class MassEvidence(Evidence):
    """Latency-mass evidence, with the per-request latency the bulk explained at each step."""

    allowance: NDArray[np.float64]


POOL_REQUESTS = 40.0
"""The bulk's mean is read over pools of at least this many requests: the mean of a handful is so
noisy that the lowest of a minute's worth sits well under the bulk, and the difference would
count, step after step, as latency above it."""


def mass_evidence(latency: NDArray[np.float64], requests: NDArray[np.float64], line: float,
                  bulk_window_cols: int, bulk_slack: float) -> MassEvidence:
    """Slow equivalents per step from per-step increments of a latency counter and its request
    counter ([S x P], NaN where a step has no increment).

    The bulk's per-request latency is the lowest pooled mean of the trailing window (rare slow
    requests lift single pools, so the minimum stays clean and follows a genuine shift of the
    bulk within the window); a pool spans as many steps as it takes for POOL_REQUESTS requests at
    the row's typical traffic. A request may take (1 + slack) x the bulk before its latency counts."""
    bulk = bulk_means(latency, requests, bulk_window_cols)
    allowance = bulk * (1.0 + bulk_slack)
    scale = np.maximum(line - bulk, 0.1 * line)
    scored = np.isfinite(latency) & (requests > 0) & np.isfinite(bulk)
    with np.errstate(invalid="ignore"):
        units = np.where(scored, np.maximum(latency - requests * allowance, 0.0) / scale, np.nan)
    return MassEvidence(units, np.where(scored, requests, np.nan), allowance)


def bulk_means(latency: NDArray[np.float64], requests: NDArray[np.float64], window_cols: int) -> NDArray[np.float64]:
    """Per step, the bulk's per-request latency: the lowest pooled mean of the `window_cols` steps
    before it (NaN: none of them has a request)."""
    return trailing_min(_pooled_means(latency, requests), window_cols)


def _pooled_means(latency: NDArray[np.float64], requests: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per step, the per-request latency over the pool of steps ending there (NaN: no request).

    A busy row's pool is its own step (most of a fleet at production traffic): its mean is read
    directly, and only rows with wider pools pay for running sums."""
    rows, cols = latency.shape
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(latency) & np.isfinite(requests) & (requests > 0)
    if cols == 0:
        return np.full((rows, cols), np.nan)
    req = np.where(ok, requests, 0.0)
    typical = req.sum(axis=1) / np.maximum(ok.sum(axis=1), 1)
    width = np.clip(np.ceil(POOL_REQUESTS / np.where(np.isfinite(typical) & (typical > 0), typical, 1.0)),
                    1, max(1, cols)).astype(np.int64)
    # Where a step counts, its mean is latency / requests; elsewhere NaN, set below (a few places).
    with np.errstate(divide="ignore", invalid="ignore"):
        means = latency / requests
    wide = np.flatnonzero(width > 1)
    if wide.size:
        zero = np.zeros((wide.size, 1))
        cum_lat = np.concatenate([zero, np.cumsum(np.where(ok[wide], latency[wide], 0.0), axis=1)], axis=1)
        cum_req = np.concatenate([zero, np.cumsum(req[wide], axis=1)], axis=1)
        pooled_req = _pooled(cum_req, width[wide])
        with np.errstate(divide="ignore", invalid="ignore"):
            means[wide] = np.where(pooled_req > 0, _pooled(cum_lat, width[wide]) / pooled_req, np.nan)
    np.copyto(means, np.nan, where=~ok)
    return means


def _pooled(cum: NDArray[np.float64], width: NDArray[np.int64]) -> NDArray[np.float64]:
    """Per step j of [S x (P + 1)] running sums (a leading 0), the sum over the pool of the row's
    `width` steps ending at j: cum[j + 1] - cum[max(j + 1 - width, 0)]. Rows are taken by width
    (a fleet has a few distinct ones) as shifted slices; a gather of every element cost most of
    the bulk's estimate."""
    rows, cols = cum.shape[0], cum.shape[1] - 1
    out = np.empty((rows, cols))
    for w in np.unique(width).tolist():
        sel = slice(None) if width.size and (width == w).all() else np.flatnonzero(width == w)
        c = cum[sel]
        part = np.empty((c.shape[0], cols))
        part[:, w - 1:] = c[:, w:] - c[:, :cols - w + 1]
        part[:, :w - 1] = c[:, 1:w] - c[:, :1]
        out[sel] = part
    return out


def count_evidence(at_or_below: NDArray[np.float64], requests: NDArray[np.float64]) -> Evidence:
    """Exact evidence from per-step increments of the requests at or below the line (a
    histogram's bucket at L) and of all requests (its count): a step is scored where both are
    finite, the count is positive and the bucket does not exceed it."""
    with np.errstate(invalid="ignore"):
        above = requests - at_or_below
        scored = np.isfinite(above) & (requests > 0) & (above >= 0)
    return Evidence(np.where(scored, above, np.nan), np.where(scored, requests, np.nan))


def trailing_min(x: NDArray[np.float64], window: int) -> NDArray[np.float64]:
    """Min of the `window` columns before each column (the column itself excluded), NaN-skipping;
    NaN where none of them has a value (the values are finite or NaN, as pooled means are).

    A sliding minimum by doubling: minima of 2, 4, 8 ... adjacent columns, then two overlapping
    spans cover the window (a minimum does not mind counting a column twice): about log2(window)
    passes over the array instead of one per column of the window, and no [S x P x window]
    temporary. The window is padded with NaN on the left, so the first columns take the minimum of
    what they have."""
    rows, cols = x.shape
    width = min(window, cols)
    if width < 1:
        return np.full((rows, cols), np.nan)
    padded = np.full((rows, width + cols), np.nan)
    padded[:, width:] = x
    # np.fmin skips NaN (the minimum of a value and NaN is the value; of two NaN, NaN), so the
    # window's NaN need no stand-in and a window of nothing but NaN is NaN as it stands.
    span, spans = 1, padded  # spans[:, k]: the min of padded[:, k : k + span]
    while 2 * span <= width:
        spans = np.fmin(spans[:, :-span], spans[:, span:])
        span *= 2
    # Column j's window is padded[:, j : j + width]: the spans starting at j and at j + width - span.
    return np.fmin(spans[:, :cols], spans[:, width - span:width - span + cols])
