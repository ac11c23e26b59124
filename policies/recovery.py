"""Did the remediation help? A pure verdict over the samples of a verify query since the action.

"P99.9 below 500 ms for 60 s within 3 min": recovered once the condition has held over a stretch
of at least `hold_seconds` (samples no further apart than `max_gap_seconds`) that ends within
`within_seconds` of the action; not recovered when the window closes without such a stretch;
unknown when the window closes without a single sample (no data is never read as success).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Sequence


class Recovery(StrEnum):
    PENDING = "pending"  # the window is still open and the condition has not held long enough
    RECOVERED = "recovered"
    NOT_RECOVERED = "not_recovered"
    UNKNOWN = "unknown"  # no data in the whole window


@dataclass(frozen=True)
class RecoveryCondition:
    """The line the verify query must stay on the good side of, and for how long."""

    below: float | None = None
    above: float | None = None
    hold_seconds: float = 60.0
    within_seconds: float = 180.0
    max_gap_seconds: float = 60.0

    def __post_init__(self) -> None:
        if (self.below is None) == (self.above is None):
            raise ValueError("give exactly one of 'below' and 'above'")
        if self.hold_seconds < 0 or self.within_seconds <= 0 or self.hold_seconds > self.within_seconds:
            raise ValueError("need 0 <= hold <= within and within > 0")

    def good(self, value: float) -> bool:
        if value != value:  # NaN: no answer, never good
            return False
        if self.below is not None:
            return value < self.below
        assert self.above is not None  # __post_init__ requires exactly one side
        return value > self.above

    def describe(self) -> str:
        side = f"below {self.below:g}" if self.below is not None else f"above {self.above:g}"
        return f"{side} for {self.hold_seconds:g}s within {self.within_seconds:g}s"


@dataclass(frozen=True)
class RecoveryVerdict:
    state: Recovery
    reason: str
    held_from: float | None = None  # start of the stretch that proved recovery


def judge_recovery(samples: Sequence[tuple[float, float]], acted_at: float, now: float,
                   condition: RecoveryCondition) -> RecoveryVerdict:
    """The verdict at `now` for (unix time, value) samples of the verify query.

    Only samples after `acted_at` and inside the window count; they need not be sorted.
    """
    deadline = acted_at + condition.within_seconds
    points = sorted((t, v) for t, v in samples if acted_at <= t <= min(now, deadline))
    run_start: float | None = None
    last_t: float | None = None
    worst_recent: float | None = None
    for t, v in points:
        if last_t is not None and t - last_t > condition.max_gap_seconds:
            run_start = None  # a gap breaks the stretch: unseen time is not good time
        last_t = t
        if not condition.good(v):
            run_start, worst_recent = None, v
            continue
        if run_start is None:
            run_start = t
        if t - run_start >= condition.hold_seconds:
            return RecoveryVerdict(Recovery.RECOVERED,
                                   f"held {condition.describe()} from {run_start:.0f} to {t:.0f}", run_start)
    if now < deadline:
        return RecoveryVerdict(Recovery.PENDING, f"waiting: {condition.describe()}")
    if not points:
        return RecoveryVerdict(Recovery.UNKNOWN, f"no data in the {condition.within_seconds:g}s window: "
                                                 "not read as recovered")
    last_bad = f"; last bad value {worst_recent:g}" if worst_recent is not None else ""
    return RecoveryVerdict(Recovery.NOT_RECOVERED,
                           f"did not hold {condition.describe()} ({len(points)} samples{last_bad})")
