"""Detection: a detector's verdict on one series at one moment (fired or not, and why)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Detection:
    """The result of `Detector.detect`.

    `fired` is the decision; `reason` says why in one line (also when not fired: too little
    history, no data, baseline too small ...), so the journal can show the value behind it.
    `episode_start` is the unix time of the first evidence point of this episode: the same
    episode detected on the next cycle carries the same value, which makes it the dedup key.
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
