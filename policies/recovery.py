"""Did the remediation help? A pure verdict over the samples of a verify query since the action.

"P99.9 below 500 ms for 60 s within 3 min": recovered once the condition has held over a stretch
of at least `hold_seconds` (samples no further apart than `max_gap_seconds`) that ends within
`within_seconds` of the action. Not recovered only on complete evidence: when the window has closed,
at least `samples_needed` samples were read, and every stretch long enough to hold the condition was
either seen (samples no further apart than `max_gap_seconds`, no NaN) or broken by a bad sample.
Anything less (no data, an outage after some samples, a gap a hold fits in, too few samples) is
unknown: the caller must never undo a rollback on it (no data is never read as failure, nor success).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Sequence


class Recovery(StrEnum):
    PENDING = "pending"  # the window is still open and the condition has not held long enough
    RECOVERED = "recovered"
    NOT_RECOVERED = "not_recovered"  # proven: the window was seen well enough that a recovery would show
    UNKNOWN = "unknown"  # the evidence is incomplete: no data, an outage, a gap, too few samples


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
        if not self.max_gap_seconds > 0:
            raise ValueError("need max_gap > 0")

    def good(self, value: float) -> bool:
        if value != value:  # NaN: no answer, never good
            return False
        if self.below is not None:
            return value < self.below
        assert self.above is not None  # __post_init__ requires exactly one side
        return value > self.above

    @property
    def samples_needed(self) -> int:
        """The fewest samples that can show a hold (no two further apart than the gap allows): a
        window judged on fewer could not have shown a recovery, so it cannot show its absence."""
        return math.ceil(self.hold_seconds / self.max_gap_seconds) + 1

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

    Only samples after `acted_at` and inside the window count; they need not be sorted. NaN is no
    answer: it breaks a good stretch and proves nothing bad.
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
            run_start = None
            if v == v:
                worst_recent = v
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
    read = [v for _, v in points if v == v]
    if len(read) < condition.samples_needed:
        return RecoveryVerdict(Recovery.UNKNOWN, f"{len(read)} sample(s) with a value in the "
                                                 f"{condition.within_seconds:g}s window; a hold of "
                                                 f"{condition.hold_seconds:g}s needs at least {condition.samples_needed}")
    unseen = unseen_stretch(points, acted_at, deadline, condition)
    if unseen is not None:
        start, end = unseen
        return RecoveryVerdict(Recovery.UNKNOWN, f"not seen from {start:.0f} to {end:.0f} ({end - start:g}s without "
                                                 f"a sample or with no value), where {condition.describe()} could "
                                                 f"have held ({len(points)} samples)")
    last_bad = f"; last bad value {worst_recent:g}" if worst_recent is not None else ""
    return RecoveryVerdict(Recovery.NOT_RECOVERED,
                           f"did not hold {condition.describe()} ({len(points)} samples{last_bad})")


def unseen_stretch(points: Sequence[tuple[float, float]], acted_at: float, deadline: float,
                   condition: RecoveryCondition) -> tuple[float, float] | None:
    """The first stretch of the window a hold could have fitted in unseen, or None when there is none.

    Bad samples cut the window into stretches; one shorter than the hold cannot hide a recovery. A
    longer one is seen only when its samples (and its ends) are no further apart than the gap allows
    and none is NaN: then the good run found in it is all there was. `points` are sorted.
    """
    edges = [acted_at, *(t for t, v in points if v == v and not condition.good(v)), deadline]
    for lo, hi in zip(edges, edges[1:]):
        if hi - lo < condition.hold_seconds:
            continue  # bounded by bad samples (or the window) too closely for a hold to fit
        inside = [(t, v) for t, v in points if lo < t < hi]
        nan = next((t for t, v in inside if v != v), None)
        if nan is not None:
            return lo, hi
        seen = [lo, *(t for t, _ in inside), hi]
        for a, b in zip(seen, seen[1:]):
            if b - a > condition.max_gap_seconds:
                return a, b
    return None
