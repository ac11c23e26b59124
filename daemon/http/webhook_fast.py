"""The webhook as Alertmanager sends it, decoded and checked in one pass (msgspec).

Alertmanager's bodies have a fixed shape: every field known, RFC 3339 timestamps, text labels.
Such a body is decoded here into typed structs without building the generic JSON tree first and
then validating it (the full path in `intake`: json.loads with bounds, then pydantic), at a fraction
of the CPU. This path accepts only a subset of what the full path accepts, and gives the same
signals for it: a body with any other field, a timestamp in another form, a surrogate escape, a
number out of range or any error returns None, and the full path decides, with its own messages.
tests/unit/test_webhook_fast.py holds the two paths to that.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Literal, NamedTuple

import msgspec

from core.signal import Signal
from daemon.http.intake import (
    MAX_ANNOTATION_VALUE_CHARS, MAX_FINGERPRINT_CHARS, MAX_LABEL_NAME_CHARS, MAX_LABEL_VALUE_CHARS, MAX_LABELS,
    MAX_YEAR, MIN_YEAR, SURROGATE_ESCAPE, alert_signal, alert_signals, read_payload,
)

# The bounds of intake's pydantic models, as msgspec constraints.
_LabelName = Annotated[str, msgspec.Meta(max_length=MAX_LABEL_NAME_CHARS)]
_Labels = Annotated[dict[_LabelName, Annotated[str, msgspec.Meta(max_length=MAX_LABEL_VALUE_CHARS)]],
                    msgspec.Meta(max_length=MAX_LABELS)]
_Annotations = Annotated[dict[_LabelName, Annotated[str, msgspec.Meta(max_length=MAX_ANNOTATION_VALUE_CHARS)]],
                         msgspec.Meta(max_length=MAX_LABELS)]
_Status = Literal["firing", "resolved"]


class _Alert(msgspec.Struct, forbid_unknown_fields=True):
    status: _Status
    labels: _Labels
    startsAt: str
    annotations: _Annotations = msgspec.field(default_factory=dict)
    endsAt: str | None = None
    generatorURL: str = ""
    fingerprint: Annotated[str, msgspec.Meta(max_length=MAX_FINGERPRINT_CHARS)] = ""


class _Payload(msgspec.Struct, forbid_unknown_fields=True):
    version: Literal["4"]
    status: _Status
    alerts: Annotated[list[_Alert], msgspec.Meta(min_length=1)]
    receiver: str = ""
    groupKey: str = ""
    groupLabels: dict[str, str] = msgspec.field(default_factory=dict)
    commonLabels: dict[str, str] = msgspec.field(default_factory=dict)
    commonAnnotations: dict[str, str] = msgspec.field(default_factory=dict)
    externalURL: str = ""
    # int64: msgspec reads integers of any length, the full path refuses those over 40 characters
    truncatedAlerts: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] = 0


_DECODER = msgspec.json.Decoder(_Payload)
# RFC 3339 as Go writes it (time.RFC3339Nano), ASCII digits only: the form both parsers read alike.
# datetime.fromisoformat (3.11) reads more (week dates, basic format), pydantic less: other forms go
# to the full path. Both truncate fractions past microseconds.
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:Z|[+-][0-9]{2}:[0-9]{2})")


class Webhook(NamedTuple):
    signals: list[Signal]
    group_key: str


def read_webhook(raw: bytes) -> Webhook:
    """The signals of a webhook body: this path for the usual shape, else intake's full path.
    Raises BodyError (HTTP 400) or PayloadError (HTTP 422) as intake.read_payload does."""
    fast = fast_webhook(raw)
    if fast is not None:
        return fast
    payload = read_payload(raw)
    return Webhook(alert_signals(payload), payload.groupKey)


def _timestamp(text: str) -> datetime | None:
    if _RFC3339.fullmatch(text) is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:  # 24:00, 60 s, day 31 of a short month: the full path names the error
        return None


def fast_webhook(raw: bytes) -> Webhook | None:
    """The signals of a webhook of the usual shape, or None for the full path to decide."""
    if SURROGATE_ESCAPE.search(raw) is not None:
        return None
    try:
        payload = _DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # a msgspec.ValidationError is a DecodeError
        return None
    receiver, group_key = payload.receiver, payload.groupKey
    signals = []
    for alert in payload.alerts:
        labels = alert.labels
        starts_at = _timestamp(alert.startsAt)  # the pattern requires an offset: never naive
        if starts_at is None or "alertname" not in labels:
            return None
        if alert.endsAt is not None and _timestamp(alert.endsAt) is None:
            return None
        try:
            year = starts_at.astimezone(timezone.utc).year
        except (OverflowError, ValueError):
            return None
        if not MIN_YEAR <= year <= MAX_YEAR:
            return None
        signals.append(alert_signal(labels, alert.status, starts_at, alert.fingerprint, alert.annotations,
                                    alert.generatorURL, receiver, group_key))
    return Webhook(signals, group_key)
