"""The alert a policy's alert trigger receives, modelled two ways on per-second counts of the
model's requests (all versions: the rule sums the model's series):

- `exact`: the window's quantile computed exactly, as `histogram_quantile(0.999, rate(..._bucket[1m]))`
  over a histogram with a bound at the line computes it: above the line when more than 0.1% of the
  window's requests are above it.
- `summary`: Triton's summary quantile (a sliding ~60 s window), which under-reports rare slow
  requests: with 4 slow requests in its window (0.2% at 40 req/s) it stayed at 7-9 ms and crossed
  only at the 5th, and at 4 req/s three slow requests in 900 s never moved it (docs/stack-facts.md).
  Modelled as above the line when the window holds at least `min_slow` (5) slow requests and more
  than 0.1% of its requests; its dips (a `for:` reset while slow requests are still in the window)
  are not modelled, so this rule fires at least as often as Triton's.

Both evaluate every 5 s (Prometheus' rule interval) over the 60 s ending there, hold `for:` (30 s:
true at t, t + 5, ..., t + 30) and deliver one webhook per firing episode `group_wait` (5 s) after
it starts firing. Alertmanager's repeat (4 h by default) of a still-firing alert is not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

EVAL_SECONDS = 5.0
WINDOW_SECONDS = 60.0
SUMMARY_MIN_SLOW = 5  # docs/stack-facts.md: crossed at the 5th slow request in its ~60 s window


@dataclass(frozen=True)
class AlertModel:
    kind: str  # exact | summary
    quantile: float = 0.999
    for_seconds: float = 30.0
    group_wait_seconds: float = 5.0
    min_slow: int = SUMMARY_MIN_SLOW

    @property
    def name(self) -> str:
        if self.kind == "exact":
            return f"exact window quantile (for: {self.for_seconds:g}s)"
        return f"Triton summary (>= {self.min_slow} slow in ~60 s, for: {self.for_seconds:g}s)"

    def above(self, slow: NDArray[np.float64], requests: NDArray[np.float64]) -> NDArray[np.bool_]:
        """Whether the rule's expression is above the line, per window sum."""
        over = slow > (1.0 - self.quantile) * requests
        if self.kind == "summary":
            over &= slow >= self.min_slow
        elif self.kind != "exact":
            raise ValueError(f"unknown alert model {self.kind!r}: exact or summary")
        return over


def run_lengths(true: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Per row, how many consecutive columns up to and including each one are true."""
    cols = true.shape[1]
    idx = np.broadcast_to(np.arange(1, cols + 1), true.shape)
    last_false = np.maximum.accumulate(np.where(true, 0, idx), axis=1)
    return np.where(true, idx - last_false, 0).astype(np.int64)


def notifications(model: AlertModel, slow: NDArray[np.float64], requests: NDArray[np.float64],
                  t0: float, step: float = 1.0) -> list[NDArray[np.float64]]:
    """Per row, the times (seconds, column 0 spanning t0 .. t0 + step) the webhook of each firing
    episode arrives. `slow`, `requests`: [R x N] per-step counts of the model's requests above the
    line and of all its requests (`requests` may be [N], shared by the rows)."""
    rows, cols = slow.shape
    every = int(round(EVAL_SECONDS / step))
    width = int(round(WINDOW_SECONDS / step))
    req = np.broadcast_to(requests, slow.shape)
    zero = np.zeros((rows, 1))
    cs = np.hstack([zero, np.cumsum(slow, axis=1)])
    cr = np.hstack([zero, np.cumsum(req, axis=1)])
    ends = np.arange(every, cols + 1, every)  # evaluation after these many columns
    lo = np.maximum(ends - width, 0)
    above = model.above(cs[:, ends] - cs[:, lo], cr[:, ends] - cr[:, lo])
    need = int(round(model.for_seconds / EVAL_SECONDS)) + 1
    starts = run_lengths(above) == need  # the evaluation at which pending turns firing
    times = t0 + ends * step + model.group_wait_seconds
    return [times[np.flatnonzero(starts[r])] for r in range(rows)]
