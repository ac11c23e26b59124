"""The aiohttp app: Alertmanager webhook, health, readiness and the daemon's own metrics."""
from __future__ import annotations

import hmac
import json
from typing import Any, Protocol

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core.signal import Signal
from daemon.common.config import Settings
from daemon.common.metrics import Metrics
from daemon.http.intake import PayloadError, alert_signals, parse_payload
from daemon.storage.journal import AsyncJournal, JournalError

log = structlog.get_logger("tailguard.http")


class Daemon(Protocol):
    """What the HTTP app needs from the running daemon (the service implements it)."""

    settings: Settings
    metrics: Metrics
    journal: AsyncJournal
    webhook_token: str | None

    def may_act(self) -> bool:
        """Whether this replica may take signals now (the leader, with the shared state imported)."""

    def enqueue(self, signal_id: int, signal: Signal) -> None:
        """Hand a journaled signal to the workers."""

    def readiness(self) -> dict[str, Any]:
        """The /readyz document; `ready` says whether to answer 200."""


SERVICE: web.AppKey[Daemon] = web.AppKey("service")


def _error(status: int, reason: str, **headers: str) -> web.Response:
    return web.json_response({"error": reason}, status=status, headers=headers or None)


async def receive_alerts(request: web.Request) -> web.Response:
    """POST /api/v1/alerts. 2xx only once every alert is journaled; 4xx for bad input (Alertmanager
    does not retry those); 503 when the alert must come again (journal down, not the leader)."""
    svc = request.app[SERVICE]
    response = await _receive(request, svc)
    svc.metrics.webhooks.labels(str(response.status)).inc()
    return response


async def _receive(request: web.Request, svc: Daemon) -> web.Response:
    token = svc.webhook_token
    if token is not None:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            return _error(401, "missing or invalid bearer token", **{"WWW-Authenticate": "Bearer"})
    if not svc.may_act():
        return _error(503, "this replica is not the leader; retry", **{"Retry-After": "5"})
    if request.content_length is not None and request.content_length > svc.settings.webhook.max_body_bytes:
        return _error(413, f"body larger than {svc.settings.webhook.max_body_bytes} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"body larger than {svc.settings.webhook.max_body_bytes} bytes")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return _error(400, f"malformed JSON: {exc}")
    try:
        payload = parse_payload(body)
    except PayloadError as exc:
        return _error(422, str(exc))
    signals = alert_signals(payload)
    for s in signals:
        svc.metrics.alerts_received.labels(s.status.value).inc()
    try:
        new, duplicates = await svc.journal.record_signals(signals)
    except JournalError as exc:
        svc.metrics.faults.labels("journal").inc()
        log.error("journal write failed; asking Alertmanager to retry", error=str(exc))
        return _error(503, "journal unavailable; retry", **{"Retry-After": "5"})
    svc.metrics.alerts_deduplicated.inc(duplicates)
    for signal_id, signal in new:
        svc.metrics.signals.labels(signal.source.value, signal.name).inc()
        svc.enqueue(signal_id, signal)
    log.info("webhook accepted", alerts=len(signals), new=len(new), duplicates=duplicates,
             group=payload.groupKey)
    return web.json_response({"accepted": len(new), "duplicates": duplicates})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    detail = svc.readiness()
    return web.json_response(detail, status=200 if detail["ready"] else 503)


async def metrics(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    body = generate_latest(svc.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(service: Daemon) -> web.Application:
    app = web.Application(client_max_size=service.settings.webhook.max_body_bytes)
    app[SERVICE] = service
    app.router.add_post("/api/v1/alerts", receive_alerts)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
