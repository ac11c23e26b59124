"""What a report shows, as plain frozen values: no plotting library in sight."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MARKER_KINDS = ("deploy", "detection", "action", "verification", "recovery")
"""Kinds with their own colour; any other kind is drawn in a neutral colour."""


@dataclass(frozen=True)
class Series:
    """One line: values over unix-second times, drawn on the panel named `panel`."""

    name: str
    times: Sequence[float]
    values: Sequence[float]
    unit: str
    panel: str = "latency"


@dataclass(frozen=True)
class Marker:
    """A moment on the timeline (a vertical line on every panel), e.g. a deploy or an action."""

    t: float
    label: str
    kind: str


@dataclass(frozen=True)
class Span:
    """An interval shaded on every panel (an alert pending/firing); `end=None` runs to the end."""

    start: float
    end: float | None
    label: str


@dataclass(frozen=True)
class Threshold:
    """A horizontal line on one panel, e.g. the P99.9 limit a policy guards."""

    value: float
    label: str
    panel: str = "latency"


@dataclass(frozen=True)
class Report:
    """Everything one report shows: the plot's parts, the table under it and free notes."""

    title: str
    series: list[Series]
    markers: list[Marker] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    thresholds: list[Threshold] = field(default_factory=list)
    table_header: tuple[str, ...] = ()
    table_rows: list[tuple[str, ...]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def panels(self) -> list[str]:
        """Panel names in first-seen order (series first, then thresholds); never empty."""
        names: list[str] = []
        for name in [s.panel for s in self.series] + [t.panel for t in self.thresholds]:
            if name not in names:
                names.append(name)
        return names or ["latency"]
