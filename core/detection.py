"""Detection: a detector's verdict on one series at one moment (fired or not, and why), and the
recovery line a firing detection draws for the check that follows acting on it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Mapping, Sequence


class Side(str, Enum):
    """A side of a line, in the query's unit."""

    BELOW = "below"
    ABOVE = "above"


class DetectorStatus(IntEnum):
    """Why a detector did or did not decide on a series, one meaning per value for every detector;
    only OK rows can fire. Vectorized code keeps int8 arrays of these values; each Detection carries
    its own (`Detection.status`)."""

    OK = 0
    """Decided: fired or not on the evidence."""
    NO_DATA = 1
    """No usable point (or no sample of both counters) in the lookback window, or a series that
    cannot be read at all (malformed samples)."""
    STALE = 2
    """The newest point is older than the detector's `max_staleness_seconds`."""
    SHORT_HISTORY = 3
    """Too little history to compare against (a baseline, or a step with a bulk)."""
    NO_RECENT = 4
    """Points in the lookback, none in the evaluation window."""
    CONSTANT = 5
    """A constant series: nothing to compare."""
    COMPANION_MISSING = 6
    """The detector requires a companion series and it has no data."""
    NO_COUNTS = 7
    """No request counter beside the latency counter."""
    INCONSISTENT = 8
    """A histogram whose bucket at the line counts more than its total in every step."""
    FAILED = 9
    """The detector raised on the series (a bug, never bad data): the poller's stand-in verdict."""


@dataclass(frozen=True)
class RecoveryLine:
    """The line a firing detection draws at its episode's start: the detector's own query has
    recovered once it holds on the `good` side of `level` (policies.planning.recovery_check). A
    detector that fires above its line (latency) recovers below it; one that fires below
    (throughput), above. Drawn from what the detector saw before the episode, never from data the
    incident has contaminated; journaled with the signal (`Signal.recovery_line`).

    `drawn_from` says what the line is in a few words (`threshold`, `baseline`): the recovery
    check's `source` names it.
    """

    level: float
    good: Side
    drawn_from: str

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level, "good": self.good.value, "drawn_from": self.drawn_from}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RecoveryLine":
        """The line `as_dict` gave; raises (KeyError, ValueError, TypeError) on anything else."""
        return cls(float(data["level"]), Side(data["good"]), str(data["drawn_from"]))


@dataclass(frozen=True)
class RecoveryRule:
    """What a detector's parameters say about its recovery lines before it detects anything
    (`DetectorParams.recovery_rule`): the side its query recovers on, and the level when the
    parameters fix it (a static threshold) rather than each episode drawing its own."""

    good: Side
    fixed_level: float | None = None


def threshold_or_baseline(good: Side, threshold: float | None, baseline: float | None) -> RecoveryLine | None:
    """The line at `threshold` when it is a finite number, else at `baseline` when that is, else
    none: the rule of the detectors whose threshold and baseline are levels in their query's unit."""
    if threshold is not None and math.isfinite(threshold):
        return RecoveryLine(float(threshold), good, "threshold")
    if baseline is not None and math.isfinite(baseline):
        return RecoveryLine(float(baseline), good, "baseline")
    return None


@dataclass(frozen=True)
class BudgetEvidence:
    """What a detection saw over its lookback, for the test in the other direction (is the version
    within its budget?): requests above the line among requests, and the shares the test weighs
    (the null the detector's rate is stated at, and the smallest regression it watches for)."""

    above: float
    requests: float
    null: float
    alternative: float
    allowed: float | None = None
    """The share the line allows above it, in the evidence's units (the budget; counters: times
    the heaviest slow request the promise covers). None: not stated (no shared-slowdown test)."""


@dataclass(frozen=True)
class Detection:
    """The result of `Detector.detect`.

    `fired` is the decision; `reason` says why in one line (also when not fired: too little
    history, no data, baseline too small ...), so the journal can show the value behind it.
    `episode_start` is the unix time of the first evidence point of this episode: the same
    episode detected on the next cycle carries the same value, which makes it the dedup key.
    `recovery_line` is set on a firing detection whose query is a level a Prometheus check can
    hold (not on counters): what the recovery check after acting holds the query to.
    `budget` is set by detectors that count requests above a line (tail_excess): what a gate on
    an alert trigger weighs before letting the alert act.
    `status` says why the detector did or did not decide: OK (the default) on a verdict, fired or
    not; any other value when nothing was decided (no data, stale, too little history ...), the
    `reason` saying it in words.
    `blind_near_line` is set where the evidence could not show a slow request just above the line
    this cycle (tail_excess on counters whose bulk's noise raised what a lone request must pass past
    BLIND_FACTOR x the line): a cycle of only such rows is no sight of the target for the governed
    alert rule (policies.governance), so its backstop can act on a breach the count cannot see.
    """

    detector: str
    fired: bool
    reason: str
    value: float | None = None
    baseline: float | None = None
    score: float | None = None
    threshold: float | None = None
    episode_start: float | None = None
    evidence: tuple[tuple[float, float], ...] = ()  # (unix time, value) points that decided it
    details: Mapping[str, Any] = field(default_factory=dict)
    recovery_line: RecoveryLine | None = None
    budget: BudgetEvidence | None = None
    status: DetectorStatus = DetectorStatus.OK
    blind_near_line: bool = False


def sees_target(detections: Sequence[Detection]) -> bool:
    """Whether a cycle's verdicts are sight of the target for the governed alert rule: False only
    where some row is `blind_near_line` and no row decided with sight (every row blind or not OK)."""
    blind = [d.blind_near_line for d in detections]
    return not (any(blind) and all(b or d.status is not DetectorStatus.OK for b, d in zip(blind, detections)))
