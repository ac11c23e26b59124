"""Slow requests counted per step on latency counters: the evidence of `tail_excess` on Triton's
counters where steps are short (docs/detectors.md, "Counters: slow requests counted per step").

A latency counter and a request counter show each step's latency mass. Where a step holds few
requests (Triton's /metrics read every second: 40 requests a step at 40 req/s), a slow request is
one lump on top of the bulk, and a step's excess over the bulk is (almost always) no request or one
request above the line, whatever its size. So a step counts as a request above the line when its
excess implies one (excess over the bulk's per-request centre > line - centre), not as the
excess's worth of requests: one request at 3,000 ms is one request above 500 ms, as one at 600 ms
is. What the count can get wrong is stated and bounded, per step, from the row's own recent steps:

- two slow requests in one step count once: the bank reads a step by whether it holds one, by
  that step's Bernoulli likelihood (`counting_design`, sequential/step_likelihood.py), so the
  chance of two in a step is in the promise and no count of them is guessed; the units a counted
  step reports (the start test's counts, the details) are E[N | N >= 1] at the rate of counted
  steps over the last `merge_cols` steps, so their mean is the requests'; a step too long for
  counting (`counting_problem`) is read as latency mass instead, with the reason;
- slow requests below the line (between the bulk and L) that share a step, or one near the line
  with the bulk's noise on top, can read as one above it: the threshold a step's excess must pass
  is raised until the probability of such a false count is at most FALSE_COUNT_SHARE of the
  null's counts per step (a Poisson bound on the number of sub-line lumps a step holds, each at
  most the largest seen, plus the bulk's noise beside them, sized jointly with the lumps' rate;
  never below NOISE_Z of the quiet steps' spread). The bank's null is raised by
  that share (`count_design`), so the promise holds with the false counts in it.

Pure functions over [S x P] arrays of per-step increments (NaN: no increment).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.stats import norm, poisson

from detectors.sequential.design import BankDesign
from detectors.sequential.evidence import POOL_REQUESTS, Evidence, bulk_means, trailing_min

FALSE_COUNT_SHARE = 0.01
"""False counts allowed per step (sub-line lumps read as one above the line), as a share of the
null's requests above the line per step; the bank's null is raised by as much."""
NOISE_Z = 5.0
"""A quiet step's excess beyond its mean by more than this many of its spreads is not bulk noise."""
LUMP_FLOOR = 0.1
"""A step whose excess is below this share of (line - bulk) is quiet: its excess is bulk noise."""
MERGE_LIMIT = 0.5
"""Counting holds while a step with a request above the line holds two or more at most this often
at the smallest regression the bank is made for; beyond it, latency mass (`counting_problem`)."""
WINDOW_SECONDS = 600.0
"""The sub-line lumps' rate and size and the quiet steps' spread are read over this much history."""
MAX_FILL = 0.99
"""The merge correction reads at most this share of counted steps (a rate of -ln(0.01) = 4.6)."""
HEAVY_RATE = 1.0
"""Sub-line lumps per step at which counting gives up (a slow request below the line in most steps:
the bulk is heavy, and a step's excess no longer says whether one request is above the line)."""
MIN_HISTORY = 10
"""Steps a step needs behind it (within the window) to be scored: a version's first ten seconds at
1 s steps are not evidence (its bulk is not known yet). A heavy bulk at a version's start is held
by MIN_QUIET (a step counts only once the window holds that many quiet steps): at 400 req/s with
2% at 300 ms, 0 false alarms in 200 version-days."""
TRUST_POOLS = 3
"""A step is read once this many disjoint pools' worth of requests are behind it (within the bulk's
window), so its centre, the lowest pooled mean behind it, is clean of two slow requests in a
version's first seconds (the lowest of k + 1 disjoint pools is clean of k lumps). Read earlier, such
a centre is the lumps' own mean: the steps after read as sub-line lumps and wide noise, and every
threshold in the window stays above a lone slow request for as long as the window holds them.
Counted from the traffic behind each step, so a live cycle and a replay of the same steps agree."""
MIN_QUIET = 10
"""Quiet steps the window needs for a step to count: fewer, and the bulk's noise is not known."""
QUIET_MIN = 0.2
"""Below this share of quiet steps the centre is often not a lump-free step either: a quarter of
HEAVY_RATE then gives up counting too."""
MAX_LUMPS = 1000.0
"""Sub-line lumps a step may need before its threshold is given up (no step counts)."""


@dataclass(frozen=True)
class SlowCounts(Evidence):
    """Per step [S x P]: requests above the line (counted steps x the merge correction) and
    requests; the allowance (the bulk's per-request centre x (1 + slack), as the mass path's), and
    the latency a lone slow request needed to count (the centre plus the excess a step needed; the
    line where nothing raised it; inf: none could)."""

    allowance: NDArray[np.float64]
    counts_above: NDArray[np.float64]


MIN_WINDOW_STEPS = 60
"""The bulk's centre and the merge correction are read over at least this many steps (60 s at 1 s
steps, 300 s at Prometheus' 5 s): over Prometheus' 12 steps a minute, the rate of counted steps
follows each chance cluster of the null and lifts the counts of the steps after it (at 5 s steps
and 40 req/s, 2x the stated false alarms), and the lowest mean of 12 steps is often not a quiet one."""


def windows(step_seconds: float, bulk_window_seconds: float) -> tuple[int, int, int]:
    """The columns `slow_counts` reads at steps of `step_seconds`: the bulk's centre window, the
    sub-line window (WINDOW_SECONDS, at least twice the centre's) and the merge window."""
    bulk = max(MIN_WINDOW_STEPS, int(round(bulk_window_seconds / step_seconds)))
    return bulk, max(2 * bulk, int(round(WINDOW_SECONDS / step_seconds))), bulk


def counting_design(budget: float, null_share: float, sizes: tuple[float, ...]) -> BankDesign:
    """The bank on counted steps, each read by whether it holds a request above the line (its
    Bernoulli likelihood: two in one step are in the promise), at the null raised by FALSE_COUNT_SHARE."""
    return BankDesign.for_budget(budget, null_share * (1.0 + FALSE_COUNT_SHARE), sizes, 1.0, per_step=True)


def stated_null(design: BankDesign) -> float:
    """The share above the line a count design (`counting_design`) states its promise at, before
    its null was raised by FALSE_COUNT_SHARE: what `slow_counts` sizes its false counts against."""
    return design.null / (1.0 + FALSE_COUNT_SHARE)


def merge_probability(per_step: float) -> float:
    """P(N >= 2 | N >= 1) for N Poisson with mean `per_step`: how often a step with a request above
    the line holds more than one."""
    if per_step <= 0 or not math.isfinite(per_step):
        return 0.0 if per_step <= 0 else 1.0
    return 1.0 - per_step * math.exp(-per_step) / -math.expm1(-per_step)


def counting_problem(requests_per_step: float, share: float, step_seconds: float) -> str | None:
    """Why steps of `requests_per_step` are too long to count slow requests in (None: they are not):
    at `share` above the line (the smallest regression the bank is made for), a step with one
    holds two or more more often than MERGE_LIMIT."""
    p = merge_probability(requests_per_step * share)
    if p <= MERGE_LIMIT:
        return None
    return (f"steps too long to count slow requests: at {requests_per_step:.0f} requests per {step_seconds:g} s step, "
            f"{p:.0%} of the steps with a request above the line at {share:.2%} hold two or more "
            f"(limit {MERGE_LIMIT:.0%}); read as latency mass instead (shorter steps count: `source: triton`)")


def trailing_sum(x: NDArray[np.float64], window: int) -> NDArray[np.float64]:
    """Sum of the `window` columns before each column (the column itself excluded), NaN as 0."""
    rows, cols = x.shape
    cum = np.zeros((rows, cols + 1))
    np.cumsum(np.nan_to_num(x), axis=1, out=cum[:, 1:])
    # Slices, not a gather by index arrays: the same numbers, about 8x faster on a day of steps.
    out = cum[:, :cols].copy()
    width = max(window, 0)
    if width < cols:
        out[:, width:] -= cum[:, :cols - width]
    return out


def slow_counts(latency: NDArray[np.float64], requests: NDArray[np.float64], line: float, null: float,
                bulk_window_cols: int, window_cols: int, merge_cols: int, bulk_slack: float) -> SlowCounts:
    """Requests above `line` per step from per-step increments of a latency counter and its request
    counter ([S x P]); `null` the share above the line the promise is stated at (half budget)."""
    centre = bulk_means(latency, requests, bulk_window_cols)
    with np.errstate(invalid="ignore"):
        has = np.isfinite(latency) & (requests > 0)
    steps_behind = trailing_sum(has.astype(np.float64), bulk_window_cols)
    requests_behind = trailing_sum(np.where(has, requests, 0.0), bulk_window_cols)
    # A pool holds fewer than POOL_REQUESTS + a step's requests; a window too short for three
    # (under ~2 req/s at 1 s steps) trusts half of it, as MIN_HISTORY does.
    per_step = requests_behind / np.maximum(steps_behind, 1.0)
    trusted = ((requests_behind >= TRUST_POOLS * (POOL_REQUESTS + per_step))
               | (steps_behind >= max(1, bulk_window_cols // 2)))
    with np.errstate(invalid="ignore"):
        scored = np.isfinite(latency) & (requests > 0) & np.isfinite(centre) & trusted
        excess = np.where(scored, latency - requests * centre, np.nan)
        room = np.maximum(line - centre, 0.1 * line)  # the excess of one request at the line
        quiet = scored & (excess <= LUMP_FLOOR * room)
        sub = scored & ~quiet & (excess <= room)
    q = quiet.astype(np.float64)
    seen = trailing_sum(scored.astype(np.float64), window_cols)
    n0 = trailing_sum(q, window_cols)
    n1 = trailing_sum(sub.astype(np.float64), window_cols)
    # The bulk's noise from the calm steps, those within the quiet band on either side of the centre:
    # a step far below it says the centre held a lump then (a series whose first steps are slow),
    # and would read as noise wide enough to hide every lump after it.
    with np.errstate(invalid="ignore"):
        calm = quiet & (excess >= -room)
    n_calm = trailing_sum(calm.astype(np.float64), window_cols)
    calm_excess: NDArray[np.float64] = np.where(calm, excess, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = trailing_sum(calm_excess, window_cols) / n_calm
        spread = np.sqrt(np.maximum(trailing_sum(np.square(calm_excess), window_cols) / n_calm - mean ** 2, 0.0))
    noise = np.where(n_calm > 0, mean + NOISE_Z * spread, np.inf)
    largest = -trailing_min(np.where(sub, -excess, np.nan), window_cols)  # NaN: no sub-line lump seen
    lumpy = np.isfinite(largest)
    threshold = np.maximum(room, noise)
    if lumpy.any():
        # Sub-line lumps per step, on the high side: the ratio of one-lump to quiet steps (Poisson's
        # P1 / P0, with one lump more); requests above the line change neither.
        rate = (n1[lumpy] + 1.0) / np.maximum(n_calm[lumpy], 1.0)
        quiet_share = n_calm[lumpy] / np.maximum(seen[lumpy], 1.0)
        allowed = FALSE_COUNT_SHARE * null * np.nan_to_num(requests[lumpy]) - norm.sf(NOISE_Z)
        k = lumps_needed(rate, allowed)
        # A lump in most steps: the bulk's centre (the lowest pooled mean) has taken part of them in,
        # and the bound no longer holds: no step counts.
        heavy = (rate >= HEAVY_RATE) | ((quiet_share < QUIET_MIN) & (rate >= HEAVY_RATE / 4.0))
        k = np.where((k > MAX_LUMPS) | heavy, np.inf, k)
        beside = np.minimum(noise_beside_lumps(rate, k, allowed, mean[lumpy], spread[lumpy], largest[lumpy]),
                            np.where(np.isfinite(k), LUMP_FLOOR * room[lumpy], np.inf))
        with np.errstate(invalid="ignore"):
            raised = (k - 1.0) * largest[lumpy] + beside
        threshold[lumpy] = np.maximum(threshold[lumpy], np.where(np.isnan(raised), np.inf, raised))
    # Too few steps behind a step to know the bulk's noise and the sub-line lumps: not scored; too
    # few quiet ones among them: nothing counts (a heavy bulk, or a breach in most steps).
    # History counts every step with requests (the trust gate above is about the centre, not this).
    scored &= trailing_sum(has.astype(np.float64), window_cols) >= min(MIN_HISTORY, max(1, window_cols // 2))
    threshold = np.where(n0 >= MIN_QUIET, threshold, np.inf)
    counted = scored & (excess > threshold)
    steps_seen = trailing_sum(scored.astype(np.float64), merge_cols)
    with np.errstate(invalid="ignore", divide="ignore"):
        fill = np.minimum(trailing_sum(counted.astype(np.float64), merge_cols) / np.maximum(steps_seen, 1.0), MAX_FILL)
        rate_above = -np.log1p(-fill)
        per_count = np.where(rate_above > 1e-12, rate_above / -np.expm1(-rate_above), 1.0)
    units = np.where(scored, np.where(counted, per_count, 0.0), np.nan)
    return SlowCounts(units, np.where(scored, requests, np.nan), centre * (1.0 + bulk_slack),
                      np.where(scored, centre + threshold, np.nan))


def noise_beside_lumps(rate: NDArray[np.float64], k: NDArray[np.float64], allowed: NDArray[np.float64],
                       mean: NDArray[np.float64], spread: NDArray[np.float64],
                       largest: NDArray[np.float64]) -> NDArray[np.float64]:
    """The bulk's noise a threshold of (k - 1) lumps must also clear: a false count needs k - 1
    lumps and noise beyond it, or fewer lumps and noise beyond a lump more (P(N >= k) is already
    spent). What the false-count share leaves is split between the two, so the noise beside the
    lumps is sized jointly with their rate (P(N >= k - 1) x P(noise > x)), not at NOISE_Z spreads
    on its own: beside a lone sub-line lump in 600 steps, ~1.9 spreads, not 5. Noise is Gaussian
    at the calm steps' mean and spread. The caller caps it at the quiet band's top (LUMP_FLOOR x
    the room): a step whose bulk alone goes beyond that is itself a sub-line lump, counted in
    `rate`, so noise beside k - 1 lumps beyond the band is a k-th. Inf where k is."""
    out = np.full(rate.shape, np.inf)
    ok = np.isfinite(k)
    if not ok.any():
        return out
    r, kk = rate[ok], k[ok]
    left = np.maximum(allowed[ok] - poisson.sf(kk - 1.0, r), 0.0)
    alongside = poisson.sf(kk - 2.0, r)  # P(N >= k - 1): 1 when k is 1
    with np.errstate(divide="ignore", invalid="ignore"):
        z_beside = norm.isf(np.minimum(0.5 * left / alongside, 0.5))
        z_alone = norm.isf(np.minimum(0.5 * left, 0.5))
        x = np.maximum(mean[ok] + z_beside * spread[ok], mean[ok] + z_alone * spread[ok] - largest[ok])
    out[ok] = np.where(left > 0, x, np.inf)
    return out


def lumps_needed(rate: NDArray[np.float64], allowed: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per element, the fewest lumps k >= 1 with P(N >= k) <= `allowed`, N Poisson with mean `rate`
    (inf: none up to MAX_LUMPS, or nothing allowed). Poisson's terms summed up, only where still
    needed: a step rarely needs more than a few."""
    k = np.ones(rate.shape)
    term = np.exp(-rate)  # P(N = j), from j = 0
    tail = -np.expm1(-rate)  # P(N >= j + 1)
    todo = np.flatnonzero(tail > allowed)
    k[allowed <= 0] = np.inf
    todo = todo[allowed[todo] > 0]
    j = 0
    while todo.size and j < MAX_LUMPS:
        j += 1
        term[todo] *= rate[todo] / j
        tail[todo] -= term[todo]
        k[todo] = j + 1
        todo = todo[tail[todo] > allowed[todo]]
    k[todo] = np.inf
    return k


def batch_counting_problem(requests: NDArray[np.float64], share: float, step_seconds: float) -> str | None:
    """`counting_problem` at the busiest row of per-step request increments [S x P] (NaN: none):
    one evaluation counts, or reads mass, for all its rows."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(requests) & (requests > 0)
    if not ok.any():
        return None
    per_row = np.where(ok, requests, 0.0).sum(axis=1) / np.maximum(ok.sum(axis=1), 1)
    return counting_problem(float(per_row.max()), share, step_seconds)
