"""The bank on latency counters as the live detector reads them at short steps: slow requests
counted per step (detectors/_slow_counts.py), the bank of the count design, thresholds at the
observed traffic (the operating curve's `tailguard (counters)` row).

The same run as `Tailguard` (deciders.py) but for its evidence: each chunk is counted with the
trailing history the counting reads (the bulk window, the sub-line window), carried from the
chunk before, as the live detector's lookback carries it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from detectors._slow_counts import counting_problem, slow_counts, stated_null, windows
from detectors.sequential.evidence import POOL_REQUESTS
from detectors.tail_excess import TailExcessParams
from evaluation.operating_curve.arrivals import Steps
from evaluation.operating_curve.deciders import Tailguard, TailguardRun, _Clock


@dataclass(frozen=True)
class CountedTailguard(Tailguard):
    """`Tailguard` on counters counted per step; `design` is the count design."""

    evidence: str = "slow counts"
    share: float = 0.002  # the smallest regression the bank is made for (the merge rule's share)

    @property
    def name(self) -> str:
        return "tailguard (counters)"

    def start(self, rows: int) -> "CountedRun":
        return CountedRun(self, _Clock(rows, self.promise.step_seconds))

    @classmethod
    def counting(cls, params: TailExcessParams, step_seconds: float, lookback_seconds: float) -> "CountedTailguard":
        """The decider the live detector with `params` (counters) is at steps short enough to count."""
        test, design = params.test(), params.count_design()
        if design is None:
            raise ValueError("counting per step is for evidence: counters")
        return cls(design, test.promise(step_seconds), params.line, "slow counts", lookback_seconds,
                   bulk_window_seconds=params.bulk_window_seconds, bulk_slack=params.bulk_slack,
                   share=params.sizes[0] * params.budget)


@dataclass
class CountedRun(TailguardRun):
    spec: CountedTailguard  # a Tailguard that counts

    def warm(self, steps: Steps) -> None:
        """Read `steps` as the history before the first step: the counting's windows, not the test."""
        self._evidence(steps)

    def _evidence(self, steps: Steps) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        spec = self.spec
        step = spec.promise.step_seconds
        per_step = float(np.nanmean(steps.requests)) if steps.requests.size else 0.0
        problem = counting_problem(per_step, spec.share, step)
        if problem is not None:
            raise ValueError(f"the operating curve counts at short steps only: {problem}")
        bulk, window, merge = windows(step, spec.bulk_window_seconds)
        lat, req = steps.latency_ms, steps.requests
        if self.history is not None:
            lat, req = np.hstack([self.history[0], lat]), np.hstack([self.history[1], req])
        carried = 0 if self.history is None else self.history[0].shape[1]
        null = stated_null(spec.design)
        ev = slow_counts(lat, req, spec.line_ms, null, bulk, window, merge, spec.bulk_slack)
        # The sub-line window, the bulk window before its first step, and the pool before that.
        keep = window + bulk + int(min(np.ceil(POOL_REQUESTS / max(per_step, 1e-3)), window))
        self.history = (lat[:, -keep:], req[:, -keep:])
        return ev.units[:, carried:], ev.requests[:, carried:]
