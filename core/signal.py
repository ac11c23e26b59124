"""Signal: one immutable observation that a policy may act on (an alert, a detection, a tick)."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Mapping, NamedTuple

import msgspec

from core.detection import RecoveryLine, Side

_SUMMARY_ENCODER = json.JSONEncoder(default=str)
"""What json.dumps(..., default=str) builds on every call, built once (it keeps no state between calls)."""
_TEXT_ENCODER = msgspec.json.Encoder()
"""For summaries whose details are text (_text_only); msgspec, since the intake writes one per alert."""


class SignalSource(str, Enum):
    ALERT = "alert"
    DETECTOR = "detector"
    SCHEDULE = "schedule"


class SignalStatus(str, Enum):
    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True)
class Signal:
    """What was seen, on what, and when.

    `name` is the alert name, the detector kind (e.g. ``tail_anomaly``) or ``schedule``.
    `dedup_key` identifies the occurrence: the same key seen twice is one event
    (Alertmanager resends groups; a detector re-confirms the same episode).
    `recovery_line` is the line a detector signal's detection drew (`Detection.recovery_line`);
    read back from a summary journaled before signals carried it, an `UnsidedLine`.
    """

    source: SignalSource
    name: str
    labels: Mapping[str, str]
    observed_at: datetime
    dedup_key: str
    status: SignalStatus = SignalStatus.FIRING
    value: float | None = None
    policy: str | None = None  # detector and schedule signals belong to the policy that declared them
    details: Mapping[str, Any] = field(default_factory=dict)
    recovery_line: RecoveryLine | UnsidedLine | None = None
    trigger: "TriggerRef | None" = None

    def trigger_ref(self) -> "TriggerRef":
        """The trigger that produced the signal: `trigger` when its producer wrote one, else what the
        signal itself says (a summary journaled before signals carried it, a signal built without it):
        an alert's name (its index in a policy is resolved when it matches, `policies.matching`),
        a detector's or schedule's index from its dedup key."""
        return self.trigger if self.trigger is not None else derived_trigger(self.source, self.name, self.dedup_key)

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly dict for the journal and logs."""
        return self._fields(_jsonable(self.details))

    def summary_json(self) -> str:
        """`summary()` as JSON text, serialized once (the journal's payload): valid UTF-8, so
        always storable."""
        fields = self._fields(self.details)
        if self.value is None and _text_only(self.details):
            # An alert's summary (intake builds one per alert): msgspec writes the same values
            # several times faster than json. Text it cannot encode as UTF-8 (a lone surrogate)
            # goes the general way, which escapes it.
            try:
                return _TEXT_ENCODER.encode(fields).decode()
            except (msgspec.EncodeError, TypeError, UnicodeEncodeError):
                pass
        return _SUMMARY_ENCODER.encode(fields)

    def _fields(self, details: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "source": self.source.value,
            "name": self.name,
            "labels": dict(self.labels),
            "observed_at": self.observed_at.isoformat(),
            "dedup_key": self.dedup_key,
            "status": self.status.value,
            "value": self.value,
            "policy": self.policy,
            "details": details,
        }
        line = self.recovery_line
        if self.source is SignalSource.DETECTOR and not isinstance(line, UnsidedLine):
            # Written for every detector signal, null when it drew none: a summary without the key
            # was journaled before signals carried their line, and is read the old way (an
            # UnsidedLine is written back so, its details unchanged).
            fields[RECOVERY_LINE] = line.as_dict() if line is not None else None
        if self.trigger is not None:  # absent: derived when read back (`trigger_ref`)
            fields[TRIGGER] = self.trigger.as_dict()
        return fields

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> "Signal":
        """Rebuild a Signal from its journaled `summary()` (restart recovery, the backlog's refill)."""
        observed = datetime.fromisoformat(summary["observed_at"])
        if observed.tzinfo is None:
            observed = observed.replace(tzinfo=timezone.utc)
        head = SignalHead.from_summary(summary)
        details = summary.get("details", {})
        return cls(
            source=head.source,
            name=head.name,
            labels=head.labels,
            observed_at=observed,
            dedup_key=summary["dedup_key"],
            status=head.status,
            value=summary.get("value"),
            policy=head.policy,
            details=details,
            recovery_line=_journaled_line(summary, head.source, details),
            trigger=TriggerRef.from_dict(summary[TRIGGER]) if summary.get(TRIGGER) is not None else None,
        )


RECOVERY_LINE = "recovery_line"
"""The summary's key for `Signal.recovery_line`."""
TRIGGER = "trigger"
"""The summary's key for `Signal.trigger`."""


@dataclass(frozen=True)
class TriggerRef:
    """Which trigger of a policy produced a signal: its kind, its position in the policy's `triggers`
    (None for an alert until it is matched to a policy: one alert can match several) and its name
    (the alert name, the detector type, or ``schedule``)."""

    kind: SignalSource
    index: int | None
    name: str

    def at(self, index: int) -> "TriggerRef":
        """This reference resolved to the trigger at `index` (an alert matched to one policy's trigger)."""
        return TriggerRef(self.kind, index, self.name)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "index": self.index, "name": self.name}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TriggerRef":
        index = data.get("index")
        return cls(signal_source(data["kind"]), int(index) if index is not None else None, str(data["name"]))


def derived_trigger(source: SignalSource, name: str, dedup_key: str) -> TriggerRef:
    """The reference a signal without one implies: a detector or schedule signal names its trigger's
    index in its dedup key (`detector:<policy>:<index>:...`, `schedule:<policy>:<index>:<slot>`;
    policy names hold no colon); an alert names only itself."""
    if source is SignalSource.ALERT:
        return TriggerRef(source, None, name)
    parts = dedup_key.split(":")
    index = int(parts[2]) if len(parts) >= 3 and parts[0] == source.value and parts[2].isdigit() else None
    return TriggerRef(source, index, name)


@dataclass(frozen=True)
class UnsidedLine:
    """A detector signal's line read from a summary journaled before signals carried their line (a
    signal still pending across an upgrade): its `threshold` detail, else its `baseline`, as the
    recovery check read them then. Which side is good is what its detector's parameters say
    (`DetectorParams.recovery_rule`), as it was then."""

    level: float
    drawn_from: str

    def sided(self, good: Side) -> RecoveryLine:
        return RecoveryLine(self.level, good, self.drawn_from)


def _journaled_line(summary: Mapping[str, Any], source: SignalSource,
                    details: Mapping[str, Any]) -> RecoveryLine | UnsidedLine | None:
    """The line of a journaled summary; for a detector signal journaled before signals carried one,
    the line its details gave the recovery check then (none for counters: they hold no level)."""
    if RECOVERY_LINE in summary:
        line = summary[RECOVERY_LINE]
        return RecoveryLine.from_dict(line) if line is not None else None
    if source is not SignalSource.DETECTOR or details.get("input") == "counters":
        return None
    for key in ("threshold", "baseline"):
        value = details.get(key)
        if not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value):
            return UnsidedLine(float(value), key)
    return None


class SignalHead(NamedTuple):
    """What policies match a signal on (policies.matching), read from a journaled summary without
    building the Signal: the backlog sorts a pending set this way, and builds Signals only for the
    rows it hands to the executor."""

    source: SignalSource
    name: str
    status: SignalStatus
    labels: Mapping[str, str]
    policy: str | None

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> "SignalHead":
        """The head of a journaled `summary()`; raises (KeyError, ValueError, TypeError) where
        Signal.from_summary would on these fields."""
        return cls(signal_source(summary["source"]), summary["name"], signal_status(summary.get("status", "firing")),
                   summary.get("labels", {}), summary.get("policy"))


_SOURCES = {s.value: s for s in SignalSource}
_STATUSES = {s.value: s for s in SignalStatus}


def signal_source(value: str) -> SignalSource:
    """SignalSource(value), by a dict lookup where it is a member's value (calling the enum costs
    more, and the backlog does this per pending row); raises as the enum does otherwise."""
    return _SOURCES[value] if value in _SOURCES else SignalSource(value)


def signal_status(value: str) -> SignalStatus:
    """SignalStatus(value), as signal_source (the intake does this per alert)."""
    return _STATUSES[value] if value in _STATUSES else SignalStatus(value)


def stable_key(*parts: Any) -> str:
    """A short, stable hash of JSON-able parts; used for dedup keys of non-alert signals."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _text_only(details: Mapping[str, Any]) -> bool:
    """Whether `details` holds only text and maps of text, which both encoders write alike (json's
    default=str and msgspec differ on datetimes, sets, NaN and other types). Plain loops: this runs
    once per alert on the webhook's path."""
    if type(details) is not dict:
        return False
    for key, value in details.items():
        if type(key) is not str:
            return False
        if type(value) is dict:
            for inner_key, item in value.items():
                if type(inner_key) is not str or type(item) is not str:
                    return False
        elif type(value) is not str:
            return False
    return True


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
