"""What a start test reads of a version: its evidence per step from the settle's end, and the
design that evidence is for (docs/detectors.md, "The start test").

- A histogram: requests above the line per step, exactly (the bucket at the line and the count).
- Counters: slow requests counted per step (detectors/_slow_counts.py), each counted step one
  request, never latency mass. Mass cannot tell one healthy request at 6x the line from six at
  the line: on the real stack a healthy version with 0.05% of requests at 3,000 ms was rolled
  back by a mass-reading start test. A count is what the exact bound is for (Poisson events of one
  unit), so two differences from the bank's counts:
  - no merge correction: two slow requests in one step count once. The bank reads that correction
    over the last minute of a version's steady state; over a version's first seconds it is noise
    (one counted step in ten reads as a 5% inflation of every count), and under the null a count
    that only ever undercounts keeps the bound. What it costs is power on the few steps that hold
    two (at the reference defect, 0.2 slow requests a step at 40 req/s, about one in ten);
  - the version's first steps, before the counting knows the bulk (ten steps of history and ten
    quiet ones), are counted once it does, against the first threshold it sets: those steps are
    the deploy's first evidence, where a start test buys the most.
  Where steps are too long to count (`counting_problem`: e.g. 400 req/s on Triton's 1 s
  counters), the start test does not run, said.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from detectors._counter_steps import counter_steps
from detectors._slow_counts import batch_counting_problem, slow_counts, stated_null, windows
from detectors.sequential.design import BankDesign
from detectors.tail_excess_batch import Test, front_end, step_seconds


@dataclass(frozen=True)
class StartEvidence:
    """One version's rows from a column on: per step [R x P] requests above the line and requests
    (NaN: not scored), the counter resets seen, the design it is read with, why it cannot be read
    at all ("" when it can), and per row the first column whose evidence is known once that column
    is (the steps counted later, once the bulk was known, are known from then; None: every column
    as it comes)."""

    grid: NDArray[np.float64]
    units: NDArray[np.float64]
    requests: NDArray[np.float64]
    resets: int
    design: BankDesign
    why_not: str = ""
    known_from: NDArray[np.int_] | None = None

    def span(self, since: float) -> tuple[float, float]:
        """(requests above the line, requests) summed over the steps after `since`."""
        keep = (self.grid > since)[None, :] & np.isfinite(self.units) & np.isfinite(self.requests)
        return float(np.where(keep, self.units, 0.0).sum()), float(np.where(keep, self.requests, 0.0).sum())


def start_evidence(test: Test, grid: NDArray[np.float64], primary: NDArray[np.float64],
                   totals: NDArray[np.float64], now: float) -> StartEvidence:
    """The evidence of cumulative counters [R x P] on `grid` (the range the start test covers) as
    the start test reads it: exact counts on a histogram, counted steps on counters."""
    if test.evidence == "histogram":
        front = front_end(replace(test, lookback_seconds=now - grid[0] + 1e-6), grid, primary, totals, now)
        return StartEvidence(front.grid, front.units, front.requests, int(front.resets.sum()), test.design)
    steps = counter_steps(primary, totals)
    latency, requests = steps.latency, steps.requests
    resets = int(steps.resets.sum())
    if resets:
        latency, requests = np.where(steps.resets, np.nan, latency), np.where(steps.resets, np.nan, requests)
    design = test.count_design
    step = step_seconds(grid)
    why_not = ("counting slow requests per step was not asked (counters are never read as latency mass here)"
               if design is None else batch_counting_problem(requests, test.sizes[0] * test.budget, step))
    if design is None or why_not:
        nothing = np.full(latency.shape, np.nan)
        return StartEvidence(grid, nothing, nothing, resets, design or test.design, f"no start test: {why_not}")
    null = stated_null(design)
    units, scored_requests, known_from = start_counts(latency, requests, test.line, null,
                                                      windows(step, test.bulk_window_seconds), test.bulk_slack)
    return StartEvidence(grid, units, scored_requests, resets, design, known_from=known_from)


def neighbour_evidence(test: Test, grid: NDArray[np.float64], primary: NDArray[np.float64],
                       totals: NDArray[np.float64], now: float) -> StartEvidence:
    """Another version's evidence beside a start test, read for the shared-slowdown rule: on
    counters as latency mass, never counted, so a neighbour whose heavy bulk leaves its counting
    blind (no step can say whether it holds a request above the line) is not read as none above
    the line; mass over-reads, which only holds a crossing longer."""
    if test.evidence == "histogram":
        return start_evidence(test, grid, primary, totals, now)
    mass = replace(test, lookback_seconds=now - grid[0] + 1e-6, count_design=None)
    front = front_end(mass, grid, primary, totals, now)
    return StartEvidence(front.grid, front.units, front.requests, int(front.resets.sum()), test.design)


def start_counts(latency: NDArray[np.float64], requests: NDArray[np.float64], line: float, null: float,
                 cols: tuple[int, int, int], bulk_slack: float
                 ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int_]]:
    """Per step [R x P], 1 where a step counts a request above the line and 0 where it counts none
    (NaN: not scored), and its requests: `slow_counts` without the merge correction, each row's
    steps before its first threshold counted against that threshold; and per row [R] that first
    threshold's column (0 where none was set: nothing was counted early), from which the early
    steps' counts are known."""
    counts = slow_counts(latency, requests, line, null, *cols, bulk_slack)
    scored = np.isfinite(counts.units)
    units = np.where(scored, (np.nan_to_num(counts.units) > 0).astype(np.float64), np.nan)
    scored_requests = np.where(scored, counts.requests, np.nan)
    ready = scored & np.isfinite(counts.counts_above)
    known_from = np.zeros(latency.shape[0], dtype=np.int_)
    for row in np.flatnonzero(ready.any(axis=1)).tolist():
        first = int(np.argmax(ready[row]))
        known_from[row] = first
        centre = counts.allowance[row, first] / (1.0 + bulk_slack)
        needed = counts.counts_above[row, first] - centre  # the excess a step needed to count there
        lat, req = latency[row, :first], requests[row, :first]
        with np.errstate(invalid="ignore"):
            # Steps scored before any threshold was set (too few quiet steps yet) counted none:
            # they are early steps as much as the unscored ones.
            early = np.isfinite(lat) & np.isfinite(req) & (req > 0) & ~ready[row, :first]
            units[row, :first] = np.where(early, (lat - req * centre > needed).astype(np.float64), units[row, :first])
        scored_requests[row, :first] = np.where(early, req, scored_requests[row, :first])
    return units, scored_requests, known_from


__all__ = ["StartEvidence", "neighbour_evidence", "start_counts", "start_evidence"]
