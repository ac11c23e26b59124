"""Alertmanager webhook payloads -> Signals. Lenient with new fields, strict with what we use.

Every body maps to a Signal list, a BodyError (HTTP 400) or a PayloadError (HTTP 422), never to
another exception: JSON is parsed with bounded depth and number sizes, strings must be Unicode
scalar values (SQLite and the metrics exposition cannot encode lone surrogates), labels are bounded,
and startsAt must convert to UTC within years 1970-9000.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Iterable, NoReturn

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from core.signal import Signal, SignalSource, signal_status

MAX_JSON_DEPTH = 32
"""Nesting of objects and arrays; an Alertmanager body has 4."""
MAX_NUMBER_CHARS = 40
"""Characters of one JSON number (Python's int() refuses more than 4,300 digits with ValueError)."""
MAX_LABELS = 128
MAX_LABEL_NAME_CHARS = 1024
MAX_LABEL_VALUE_CHARS = 16_384
MAX_ANNOTATION_VALUE_CHARS = 65_536
MAX_FINGERPRINT_CHARS = 256
MIN_YEAR, MAX_YEAR = 1970, 9000
"""startsAt, converted to UTC, must fall in these years (0001-01-01T00:00:00+01:00 cannot convert)."""

_LabelName = Annotated[str, StringConstraints(max_length=MAX_LABEL_NAME_CHARS)]
Labels = Annotated[
    dict[_LabelName, Annotated[str, StringConstraints(max_length=MAX_LABEL_VALUE_CHARS)]],
    Field(max_length=MAX_LABELS),
]
Annotations = Annotated[
    dict[_LabelName, Annotated[str, StringConstraints(max_length=MAX_ANNOTATION_VALUE_CHARS)]],
    Field(max_length=MAX_LABELS),
]


class _Lenient(BaseModel):
    # Alertmanager keeps adding fields (truncatedAlerts, notification_reason, routeLabels ...).
    model_config = ConfigDict(extra="allow")


class WebhookAlert(_Lenient):
    status: str = Field(pattern="^(firing|resolved)$")
    labels: Labels
    annotations: Annotations = Field(default_factory=dict)
    startsAt: datetime
    endsAt: datetime | None = None
    """Parsed, never converted: a firing alert's endsAt is 0001-01-01T00:00:00Z."""
    generatorURL: str = ""
    fingerprint: str = Field("", max_length=MAX_FINGERPRINT_CHARS)

    @field_validator("labels")
    @classmethod
    def _has_alertname(cls, value: dict[str, str]) -> dict[str, str]:
        if "alertname" not in value:
            raise ValueError("labels.alertname is required")
        return value

    @field_validator("startsAt")
    @classmethod
    def _converts_to_utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:  # RFC 3339 requires an offset; read a missing one as UTC
            value = value.replace(tzinfo=timezone.utc)
        try:
            year = value.astimezone(timezone.utc).year
        except (OverflowError, ValueError):
            year = 0
        if not MIN_YEAR <= year <= MAX_YEAR:
            raise ValueError(f"must be within years {MIN_YEAR}-{MAX_YEAR} in UTC")
        return value


class WebhookPayload(_Lenient):
    version: str
    status: str = Field(pattern="^(firing|resolved)$")
    receiver: str = ""
    groupKey: str = ""
    alerts: list[WebhookAlert] = Field(min_length=1)
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    truncatedAlerts: int = 0


class BodyError(Exception):
    """The body is not JSON within our bounds (HTTP 400)."""


class PayloadError(Exception):
    """The payload is well-formed JSON but not an Alertmanager v4 webhook (HTTP 422)."""


_SURROGATE = re.compile("[\ud800-\udfff]")
# In a body decode_body took (strict UTF-8 refuses encoded surrogates), a surrogate can only come
# from a \uD800-\uDFFF escape (JSON has no other; the decoder joins a valid pair into one character).
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def nesting_deeper_than(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest more than `limit` levels in a parsed value. Iterative, one
    level at a time, and it stops at the first level past the limit."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for container in level:
            below += [child for child in (container.values() if isinstance(container, dict) else container)
                      if isinstance(child, (dict, list))]
        level = below
    return False


def _bounded_number(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise BodyError(f"malformed JSON: a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    return text


def _parse_int(text: str) -> int:
    return int(_bounded_number(text))


def _parse_float(text: str) -> float:
    value = float(_bounded_number(text))
    if not math.isfinite(value):
        raise BodyError(f"malformed JSON: number {text} is out of range")
    return value


def _reject_constant(name: str) -> NoReturn:
    raise BodyError(f"malformed JSON: {name} is not a JSON value")


def decode_body(raw: bytes) -> Any:
    """Parse a webhook body: strict UTF-8, bounded depth and numbers. Raises BodyError."""
    try:
        text = raw.decode("utf-8")  # strict: encoded surrogates (ED A0 80) are refused too
    except UnicodeDecodeError as exc:
        raise BodyError(f"malformed JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    too_deep = BodyError(f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                           parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise BodyError(f"malformed JSON: {exc}") from None
    except RecursionError:  # the C parser gives up near the interpreter's recursion limit
        raise too_deep from None
    # Each level of nesting opens with a bracket of its own: a body with no more opening brackets
    # than the limit (those in strings counted too) cannot nest deeper, and needs no walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and nesting_deeper_than(value, MAX_JSON_DEPTH):
        raise too_deep
    return value


def field_path(parts: Iterable[Any]) -> str:
    """A readable, one-line, bounded field path: alerts.0.labels.alertname; odd keys escaped."""
    out = []
    for part in parts:
        text = str(part)
        if not text.isprintable():
            text = ascii(text)
        out.append(text if len(text) <= 64 else text[:61] + "...")
    return ".".join(out) or "body"


def _lone_surrogate(body: Any) -> str | None:
    """The path of the first string (key or value) holding a lone surrogate, or None. Iterative."""
    # One C-level pass answers the common case (none); the walk below only names the field.
    if not _SURROGATE.search(json.dumps(body, ensure_ascii=False)):
        return None
    stack: list[tuple[tuple[Any, ...], Any]] = [((), body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return field_path(path)
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return field_path((*path, key))
                stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, i), item) for i, item in enumerate(value))
    return None


def read_payload(raw: bytes) -> WebhookPayload:
    """decode_body, then parse_payload: raises BodyError or PayloadError as they do. Where the raw
    body holds no surrogate escape, the parsed body cannot hold a lone surrogate, and the search
    for one is skipped."""
    return parse_payload(decode_body(raw), surrogates=SURROGATE_ESCAPE.search(raw) is not None)


def parse_payload(body: Any, surrogates: bool = True) -> WebhookPayload:
    """The webhook in a parsed body; raises PayloadError. `surrogates=False` only where the body is
    known to hold no lone surrogate (read_payload)."""
    if not isinstance(body, dict):
        raise PayloadError("the body must be a JSON object")
    if str(body.get("version")) != "4":
        raise PayloadError(f"unsupported webhook version {field_path([repr(body.get('version'))])}; expected \"4\"")
    bad = _lone_surrogate(body) if surrogates else None
    if bad is not None:
        raise PayloadError(f"{bad}: not valid Unicode text (lone surrogate)")
    try:
        return WebhookPayload.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise PayloadError(f"{field_path(first['loc'])}: {first['msg']} ({len(exc.errors())} error(s))") from exc


def alert_fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager computes fingerprints from labels; recompute when a sender left it out."""
    blob = "\x00".join(f"{k}\x01{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def alert_signal(labels: dict[str, str], status: str, starts_at: datetime, fingerprint: str,
                 annotations: dict[str, str], generator_url: str, receiver: str, group_key: str) -> Signal:
    """The Signal of one validated alert. The dedup key is fingerprint + startsAt + status:
    Alertmanager resends the same group on every group_interval, and a resolved alert is a new event."""
    fp = fingerprint or alert_fingerprint(labels)
    return Signal(
        source=SignalSource.ALERT,
        name=labels["alertname"],
        labels=dict(labels),
        observed_at=starts_at,
        dedup_key=f"alert:{fp}:{starts_at.astimezone(timezone.utc).isoformat()}:{status}",
        status=signal_status(status),
        details={"annotations": dict(annotations), "fingerprint": fp,
                 "generatorURL": generator_url, "receiver": receiver, "groupKey": group_key},
    )


def alert_signals(payload: WebhookPayload) -> list[Signal]:
    """One Signal per alert of a validated payload."""
    receiver, group_key = payload.receiver, payload.groupKey
    return [alert_signal(a.labels, a.status, a.startsAt, a.fingerprint, a.annotations, a.generatorURL,
                         receiver, group_key) for a in payload.alerts]
