"""The start test replayed over simulated deploys, and the limit that knows the deploy time.

- `start_first`: tail_excess's start test (detectors/tail_excess_start.py) on steps that begin at
  the version's first request: the step holding that request and the settle are not evidence (the
  live rule: the start is the end of the first step with requests, the settle ends with the first
  step after it that is all but clear of the load's hold or at start + `start_settle_seconds`, and
  no step that begins before its end is scored: detectors/tail_excess_settle.py), each member's
  log-likelihood ratio summed from there, read against the
  exact bound (detectors/sequential/start_test.py) at the top of the version's traffic cell over
  the steps scored so far, as the live code computes it each cycle. On counts (a histogram) or on
  slow requests counted per step (counters, tail_excess_start_evidence.py).
- `limit_first`: the deploy-aware limit: Wald's one-sided SPRT of the true null share against the
  true defect share from the deploy's first request (no settle, no step left out), its bound the
  least one reached with the same per-deploy probability over the same horizon (the same exact
  recursion, one member).
- `false_starts`: healthy deploys (thousands at once, Poisson counts per step) through the start
  test over its horizon: the share that reach the bound, the per-deploy false-alarm probability.

Columns are steps of `step` seconds from the first request; a crossing at column c is known at the
end of its step, (c + 1) x step seconds after the first request.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
from numpy.typing import NDArray

from detectors.sequential.design import BankDesign
from detectors.sequential.start_test import start_bounds
from detectors.tail_excess import TailExcessParams
from detectors.tail_excess_settle import may_be_held, settle_columns
from detectors.tail_excess_start_evidence import start_evidence
from detectors.tail_excess_start import START_GRID
from evaluation.operating_curve.arrivals import Fault, Steps, poisson_chunk
from evaluation.operating_curve.step_limit import step_rates


@dataclass(frozen=True)
class StartSpec:
    """The start test as the live detector with `params` runs it."""

    params: TailExcessParams
    horizon_seconds: float
    settle_seconds: float

    @classmethod
    def of(cls, params: TailExcessParams) -> "StartSpec":
        return cls(params, params.start_horizon_seconds, params.start_settle_seconds)

    @property
    def alpha(self) -> float:
        return self.params.start_alpha

    @property
    def line_ms(self) -> float:
        return self.params.line

    def first_scored(self, step: float) -> int:
        """The first column the live rule scores after the longest settle: the start is the end of
        column 0, and a step is scored when it begins at or after the settle's end."""
        return int(math.ceil((step + self.settle_seconds) / step - 1e-9))


def evidence(spec: StartSpec, steps: Steps, step: float
             ) -> tuple[NDArray[np.float64], NDArray[np.float64], BankDesign, NDArray[np.int_]]:
    """Per step, what the test reads [S x P] (NaN: not scored), and the design it is read with: the
    live front end (detectors/tail_excess_batch.py `front_end`) on the cumulative counters the
    steps make, every sample before the settle's end left out as the live code leaves it out (a
    histogram's bucket and count; latency counters, slow requests counted per step:
    detectors/tail_excess_start_evidence.py)."""
    rows, cols = steps.requests.shape
    grid = step * np.arange(1, cols + 1, dtype=np.float64)  # column c's sample, at its end
    below = steps.requests - steps.above
    d_primary = below if spec.params.evidence == "histogram" else steps.latency_ms
    primary = np.cumsum(d_primary, axis=1)
    totals = np.cumsum(steps.requests, axis=1)
    # The settle ends with the first column after the first request's that the load mostly did not
    # hold, at the longest with the column before the first the longest settle scores.
    held = may_be_held(spec.params.evidence, spec.line_ms, d_primary, steps.requests)
    ends = settle_columns(held, spec.first_scored(step) - 1)
    keep = np.arange(cols)[None, :] >= ends[:, None]  # the sample at the settle's end is the first kept
    primary, totals = np.where(keep, primary, np.nan), np.where(keep, totals, np.nan)
    params = spec.params
    test = replace(params.test(), count_design=params.count_design())  # as TailExcessDetector builds it
    ev = start_evidence(test, grid, primary, totals, float(grid[-1]))
    known = ev.known_from if ev.known_from is not None else np.zeros(rows, dtype=np.int_)
    return ev.units, np.where(np.isfinite(ev.units), ev.requests, np.nan), ev.design, known


def start_first(spec: StartSpec, steps: Steps, step: float) -> NDArray[np.float64]:
    """Per row, seconds from the first request to the start test's first crossing (NaN: none
    within the horizon)."""
    units, requests, design, known_from = evidence(spec, steps, step)
    horizon_steps = max(1, int(math.ceil(spec.horizon_seconds / step)))
    end = min(units.shape[1], spec.first_scored(step) + horizon_steps)
    units, requests = units[:, :end], requests[:, :end]
    ok = np.isfinite(units) & np.isfinite(requests)
    cu = np.cumsum(np.where(ok, units, 0.0), axis=1)
    cn = np.cumsum(np.where(ok, requests, 0.0), axis=1)
    scored = np.cumsum(ok, axis=1)
    traffic = np.where(scored > 0, cn / np.maximum(scored, 1), 0.0)
    with np.errstate(divide="ignore"):
        cells = np.where(traffic > 0, np.ceil(np.log(np.where(traffic > 0, traffic, 1.0)) / math.log(START_GRID)),
                         -10_000).astype(np.int64)
    bound = np.full(cells.shape, np.inf)
    for cell in np.unique(cells[cells > -10_000]).tolist():
        b = start_bounds(design, spec.alpha, START_GRID ** cell, horizon_steps)[0]
        bound[cells == cell] = b
    crossed = np.zeros(cu.shape, dtype=bool)
    for jump, drain in zip(design.jumps, design.drains):
        crossed |= (jump * cu - drain * cn >= bound) & ok
    # A crossing on steps counted late (once the bulk was known) is seen when they are: the live
    # detector finds it at that column, not at the crossing's.
    first = _first(crossed, step)
    return np.where(np.isfinite(first), np.maximum(first, (known_from + 1) * step), first)


def limit_first(null: float, alternative: float, alpha: float, horizon_seconds: float, steps: Steps, step: float,
                requests_per_step: float) -> NDArray[np.float64]:
    """Per row, seconds from the first request to the deploy-aware SPRT's crossing (NaN: none)."""
    design = BankDesign(null, (alternative / null,))
    horizon_steps = max(1, int(math.ceil(horizon_seconds / step)))
    bound = start_bounds(design, alpha, requests_per_step, horizon_steps)[0]
    above, requests = steps.above[:, :horizon_steps], steps.requests[:, :horizon_steps]
    stat = design.jumps[0] * np.cumsum(above, axis=1) - design.drains[0] * np.cumsum(requests, axis=1)
    return _first(stat >= bound, step)


def step_limit_first(null: float, alternative: float, alpha: float, horizon_seconds: float, steps: Steps,
                     step: float, requests_per_step: float) -> NDArray[np.float64]:
    """Per row, seconds from the first request to the crossing of the deploy-aware SPRT that sees
    only whether each step holds a request above the line (NaN: none): the limit on counters when
    a slow request's size says nothing (two slow requests in a step read as one slow one twice the
    size), the true rates known, its bound the least reached with probability `alpha` over the
    horizon (exact: the count of steps that hold one, one recursion)."""
    p0, p1 = step_rates(null, alternative, requests_per_step)
    hit, miss = math.log(p1 / p0), math.log((1.0 - p1) / (1.0 - p0))
    horizon_steps = max(1, int(math.ceil(horizon_seconds / step)))
    t = np.arange(1, horizon_steps + 1, dtype=np.float64)

    def crossing(bound: float) -> float:
        need = np.maximum(np.ceil((bound - miss * t) / (hit - miss) - 1e-9), 0).astype(np.int64)
        alive = np.zeros(int(need.max()) + 1)
        alive[0] = 1.0
        for k in range(horizon_steps):
            alive = np.convolve(alive, [1.0 - p0, p0])[: alive.size]
            alive[need[k]:] = 0.0
        return 1.0 - float(alive.sum())

    lo, hi = 0.0, math.log(1.0 / alpha) + 1.0
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if crossing(mid) > alpha else (lo, mid)
    holds = (steps.above[:, :horizon_steps] > 0).astype(np.float64)
    k = np.cumsum(holds, axis=1)
    stat = hit * k + miss * (np.arange(1, holds.shape[1] + 1)[None, :] - k)
    return _first(stat >= hi, step)


def _first(crossed: NDArray[np.bool_], step: float) -> NDArray[np.float64]:
    hit = crossed.any(axis=1)
    return np.where(hit, (np.argmax(crossed, axis=1) + 1) * step, np.nan)


def false_starts(spec: StartSpec, rate: float, fault: Fault, deploys: int, step: float = 1.0, seed: int = 1,
                 chunk_rows: int = 2_000) -> int:
    """How many of `deploys` healthy deploys at `rate` req/s (slow requests at `fault`) reach the
    start test's bound within its horizon (Poisson counts per step, as the operating curve's
    false-alarm runs draw them)."""
    rng = np.random.default_rng(seed)
    cols = spec.first_scored(step) + int(math.ceil(spec.horizon_seconds / step))
    fired = 0
    for lo in range(0, deploys, chunk_rows):
        rows = min(chunk_rows, deploys - lo)
        steps = poisson_chunk(rng, np.full((rows, cols), rate * step), fault, spec.line_ms)
        fired += int(np.isfinite(start_first(spec, steps, step)).sum())
    return fired


def median_or_inf(values: Sequence[float]) -> float:
    """The median with runs that did not detect counted as never."""
    x = np.asarray(values, dtype=np.float64)
    return float(np.median(np.where(np.isnan(x), math.inf, x)))


__all__ = ["StartSpec", "evidence", "false_starts", "limit_first", "median_or_inf", "start_first",
           "step_limit_first"]
