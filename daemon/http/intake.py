"""Alertmanager webhook payloads -> Signals. Lenient with new fields, strict with what we use."""
from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.signal import Signal, SignalSource, SignalStatus


class _Lenient(BaseModel):
    # Alertmanager keeps adding fields (truncatedAlerts, notification_reason, routeLabels ...).
    model_config = ConfigDict(extra="allow")


class WebhookAlert(_Lenient):
    status: str = Field(pattern="^(firing|resolved)$")
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: datetime
    endsAt: datetime | None = None
    generatorURL: str = ""
    fingerprint: str = ""

    @field_validator("labels")
    @classmethod
    def _has_alertname(cls, value: dict[str, str]) -> dict[str, str]:
        if "alertname" not in value:
            raise ValueError("labels.alertname is required")
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


class PayloadError(Exception):
    """The payload is well-formed JSON but not an Alertmanager v4 webhook (HTTP 422)."""


def parse_payload(body: Any) -> WebhookPayload:
    if not isinstance(body, dict):
        raise PayloadError("the body must be a JSON object")
    if str(body.get("version")) != "4":
        raise PayloadError(f"unsupported webhook version {body.get('version')!r}; expected \"4\"")
    try:
        return WebhookPayload.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise PayloadError(f"{loc}: {first['msg']} ({len(exc.errors())} error(s))") from exc


def alert_fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager computes fingerprints from labels; recompute when a sender left it out."""
    blob = "\x00".join(f"{k}\x01{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def alert_signals(payload: WebhookPayload) -> list[Signal]:
    """One Signal per alert. The dedup key is fingerprint + startsAt + status: Alertmanager
    resends the same group on every group_interval, and a resolved alert is a new event."""
    out = []
    for alert in payload.alerts:
        fp = alert.fingerprint or alert_fingerprint(alert.labels)
        starts = alert.startsAt.astimezone(timezone.utc).isoformat()
        out.append(Signal(
            source=SignalSource.ALERT,
            name=alert.labels["alertname"],
            labels=dict(alert.labels),
            observed_at=alert.startsAt,
            dedup_key=f"alert:{fp}:{starts}:{alert.status}",
            status=SignalStatus(alert.status),
            details={"annotations": dict(alert.annotations), "fingerprint": fp,
                     "generatorURL": alert.generatorURL, "receiver": payload.receiver,
                     "groupKey": payload.groupKey},
        ))
    return out


def signal_from_summary(summary: dict[str, Any]) -> Signal:
    """Rebuild a Signal from its journaled summary (restart recovery)."""
    observed = datetime.fromisoformat(summary["observed_at"])
    if observed.tzinfo is None:
        observed = observed.replace(tzinfo=timezone.utc)
    return Signal(
        source=SignalSource(summary["source"]),
        name=summary["name"],
        labels=summary.get("labels", {}),
        observed_at=observed,
        dedup_key=summary["dedup_key"],
        status=SignalStatus(summary.get("status", "firing")),
        value=summary.get("value"),
        policy=summary.get("policy"),
        details=summary.get("details", {}),
    )
