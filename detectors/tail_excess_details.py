"""The `details` of a `tail_excess` row: one pure builder, and a read-only view that builds them on
first read.

A poll cycle at 10,000 series keeps every row's Detection until the next cycle (the gates weigh
them), but reads the details of a handful (the fired rows, the one `tailguard status` shows). Four
nested dicts per row were most of the cycle's tracked objects and a third of its Detection cost;
a view holding (batch table, row) is one small object, and builds the same dict when asked.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence


@dataclass(frozen=True)
class DetailsTable:
    """What every row's details are read from: the batch's constants and its per-row lists (Python
    numbers, read once per batch), shared by every row's view. Never mutated after it is built."""

    evidence: str
    step_seconds: float
    budget: float
    null: float
    false_alarm_days: float
    line: float
    histogram: bool
    sizes: tuple[str, ...]  # the members' names ("0.5x"), as the details key them
    members: int
    version_label: str
    labels: Sequence[Mapping[str, str]]
    timestamps: list[float]
    traffic: list[float]  # requests per step
    derived: list[bool]
    thresholds: list[float]  # [S * K], row-major: row r's members at r * K ...
    statistic: list[float]  # [S * K]
    leader: list[int]
    episode_units: list[float]
    episode_requests: list[float]
    window_units: list[float]
    window_requests: list[float]
    scored_steps: list[int]
    resets: list[int]
    inconsistent: list[int]
    first_seen: list[int]
    lookback_seconds: float = 900.0  # the scored window
    budget_window_seconds: float = 900.0  # what the window sums (and the alert gate) cover
    bank_false_alarm_days: float | None = None  # the bank's own promise when a start test spends part of the rate
    start: tuple[tuple[str, float], ...] = ()  # what the start test assumes (empty: it is off)


def row_details(t: DetailsTable, row: int) -> dict[str, Any]:
    """Row `row`'s details, a fresh dict (keys in the order the journal and the API have always
    shown them)."""
    k = t.members
    hs, stats = t.thresholds[row * k:(row + 1) * k], t.statistic[row * k:(row + 1) * k]
    assumed: dict[str, Any] = {
        "evidence": t.evidence, "requests_per_second": t.traffic[row] / t.step_seconds,
        "step_seconds": t.step_seconds, "budget": t.budget, "null": t.null, "false_alarm_days": t.false_alarm_days,
        "derived": t.derived[row],
        "thresholds": dict(zip(t.sizes, hs)),
        "lookback_seconds": t.lookback_seconds, "budget_window_seconds": t.budget_window_seconds,
    }
    if t.start:  # the start test beside the bank: what it assumes, and the share of the rate the bank keeps
        assumed["bank_false_alarm_days"] = t.bank_false_alarm_days
        assumed["start_test"] = dict(t.start)
    # "input": what a replica of an older version reads to draw no recovery line on counters (a
    # shared journal during a rolling upgrade); the journaled details stay as they were.
    details: dict[str, Any] = {
        "input": "counters", "evidence": t.evidence, "assumed": assumed,
        "statistic": dict(zip(t.sizes, stats)), "leader": t.sizes[t.leader[row]],
        "episode_above_line": t.episode_units[row], "episode_requests": t.episode_requests[row],
        "window_above_line": t.window_units[row], "window_requests": t.window_requests[row],
        "scored_steps": t.scored_steps[row], "counter_resets": t.resets[row],
    }
    if t.inconsistent[row]:
        details["inconsistent_steps"] = t.inconsistent[row]
    labels = t.labels[row]
    if t.version_label in labels:
        details["version"] = labels[t.version_label]
    first = t.first_seen[row]
    if first >= 0:
        details["series_first_seen"] = t.timestamps[first]
    bucket = bucket_bound(labels) if t.histogram else t.line
    if bucket is not None and bucket != t.line:
        details["bucket"] = bucket
    return details


def bucket_bound(labels: Mapping[str, str]) -> float | None:
    """The bucket bound a histogram series' `le` label names (None: none, or not a number)."""
    try:
        return float(labels["le"])
    except (KeyError, ValueError):
        return None


class RowDetails(Mapping[str, Any]):
    """Row `row`'s details, built on first read and kept (read-only: nothing downstream writes
    details; a copy, `dict(d.details)`, is a plain dict). Equal to the dict `row_details` builds,
    and pickles, copies and prints as that dict."""

    __slots__ = ("_table", "_row", "_built")

    def __init__(self, table: DetailsTable, row: int) -> None:
        self._table, self._row = table, row
        self._built: dict[str, Any] | None = None

    def _dict(self) -> dict[str, Any]:
        if self._built is None:
            self._built = row_details(self._table, self._row)
        return self._built

    def __getitem__(self, key: str) -> Any:
        return self._dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())

    def __contains__(self, key: object) -> bool:
        return key in self._dict()

    def get(self, key: str, default: Any = None) -> Any:
        return self._dict().get(key, default)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowDetails):
            return self._dict() == other._dict()
        return self._dict() == other if isinstance(other, Mapping) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a dict's: unhashable

    def __repr__(self) -> str:
        return repr(self._dict())

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (self._dict(),))
