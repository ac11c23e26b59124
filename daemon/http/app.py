"""The aiohttp app: Alertmanager webhook, health, readiness, the daemon's own metrics, and the
operator API (daemon/http/api.py)."""
from __future__ import annotations

import asyncio
import collections
import hmac
import sys
import time
from typing import Any, Awaitable, Callable, Protocol, Sequence

import aiohttp
import structlog
from aiohttp import hdrs, web
from aiohttp.web_urldispatcher import _default_expect_handler
from prometheus_client import CONTENT_TYPE_LATEST

from core.signal import Signal
from daemon.http.responses import answer_and_close, error
from daemon.http.api import Operator, add_routes
from daemon.http.auth import TOKEN_NAME
from daemon.http.intake import BodyError, PayloadError
from daemon.http.setup import SETUP, HttpSetup
from daemon.http.webhook_fast import read_webhook
from daemon.workers.signal_intake import Recorded, Refusal

log = structlog.get_logger("tailguard.http")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Daemon(Operator, Protocol):
    """What the HTTP app asks of the running daemon: named operations only, the operator API's and
    these (daemon/wiring/operations.py implements it); the journal, the settings and the
    repositories stay behind them. At most 15 members (tests/unit/test_http_daemon.py)."""

    async def ingest_alerts(self, signals: Sequence[Signal]) -> Recorded:
        """Journal one webhook's alerts (committed rows reach the workers' backlog before this
        returns); a refusal is in the answer, never raised."""

    def liveness(self) -> str | None:
        """Why the daemon's loops count as failing (one keeps crashing); None while they run."""

    async def readiness(self) -> dict[str, Any]:
        """The /readyz document, the freezes read now; `ready` says whether to answer 200."""

    async def scrape(self) -> bytes:
        """The daemon's metrics in Prometheus' text format, the freezes read now."""


SERVICE: web.AppKey[Daemon] = web.AppKey("service")
IN_FLIGHT: web.AppKey["InFlight"] = web.AppKey("webhooks_in_flight")
# What aiohttp decodes for us; anything else (x-gzip, "gzip, gzip", zstd) is refused, not read raw.
CONTENT_CODINGS = frozenset({"identity", "gzip", "deflate"})


class InFlight:
    """Webhook requests in progress: a bound, so slow or stalled senders cannot pile up."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def try_enter(self) -> bool:
        if self.count >= self.limit:
            return False
        self.count += 1
        return True

    def leave(self) -> None:
        self.count -= 1


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    if resource is not None:
        return resource.canonical
    # 404 and 405 come from a system route: name the path only when it is one of ours (bounded labels)
    ours = {r.canonical for r in request.app.router.resources()}
    return request.path if request.path in ours else "unmatched"


QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})  # probes and scrapes: one level lower


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count every response by route and status, and write its access log line; an unexpected
    exception becomes a JSON 500 that is counted and logged once (one line in JSON format) instead
    of aiohttp's plain-text traceback."""
    setup = request.app[SETUP]
    metrics = setup.metrics
    route = _route(request)
    started = time.monotonic()
    status = 500
    try:
        response = await handler(request)
        status = response.status
    except web.HTTPException as exc:  # the router's 404/405: aiohttp renders them
        metrics.http_responses.labels(route, str(exc.status)).inc()
        status = exc.status
        raise
    except Exception:
        metrics.faults.labels("http").inc()
        log.exception("unhandled error in request handler; answered 500", method=request.method, route=route)
        response = error(500, "internal error; the daemon's log has the details")
    finally:
        access_log(setup.access_log, request, route, status, time.monotonic() - started)
    metrics.http_responses.labels(route, str(response.status)).inc()
    return response


def access_log(level: str, request: web.Request, route: str, status: int, seconds: float) -> None:
    """One line per request: no body, no query string (an approval link's), no header but the token's name."""
    if level == "off":
        return
    # Always to stderr, as the daemon's configured logs go: a process whose structlog is not configured
    # (a test running the CLI beside the daemon) keeps its stdout for what it prints.
    access = structlog.wrap_logger(structlog.PrintLogger(file=sys.stderr), logger_name="tailguard.access")
    emit = access.debug if level == "debug" or route in QUIET_ROUTES else access.info
    emit("request", method=request.method, path=request.path[:256], route=route, status=status,
         duration_ms=round(seconds * 1000, 1), remote=request.remote, token=request.get(TOKEN_NAME))


async def receive_alerts(request: web.Request) -> web.Response:
    """POST /api/v1/alerts. 2xx only once every alert is journaled; 4xx for bad input (Alertmanager
    does not retry those); 503 when the alert must come again (journal down, busy, or a follower
    with a journal of its own)."""
    counted = request.app[SETUP].metrics.webhooks
    try:
        response = await _receive(request, request.app[SERVICE])
    except web.HTTPException as exc:  # aiohttp renders it
        counted.labels(str(exc.status)).inc()
        raise
    except Exception:
        counted.labels("500").inc()  # the middleware answers it
        raise
    counted.labels(str(response.status)).inc()
    return response


async def _receive(request: web.Request, svc: Daemon) -> web.Response:
    token = svc.credentials().webhook_token
    if token is not None:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        # aiohttp decodes header bytes that are not UTF-8 as surrogates: encode them back the same way
        given_bytes = given.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given_bytes, token.encode()):
            return await answer_and_close(
                request, error(401, "missing or invalid bearer token", **{"WWW-Authenticate": "Bearer"}))
        request[TOKEN_NAME] = "webhook"
    in_flight = request.app[IN_FLIGHT]
    if not in_flight.try_enter():
        return await answer_and_close(request, error(
            503, f"more than {in_flight.limit} webhook requests in progress; retry", **{"Retry-After": "1"}))
    try:
        return await _receive_admitted(request, svc)
    finally:
        in_flight.leave()


async def _receive_admitted(request: web.Request, svc: Daemon) -> web.Response:
    setup = request.app[SETUP]
    limits = setup.webhook
    if not svc.may_answer(leader_only=False):  # a shared journal takes webhooks on any replica
        return await answer_and_close(
            request, error(503, "this replica is not the leader; retry", **{"Retry-After": "5"}))
    if request.content_length is not None and request.content_length > limits.max_bytes:
        # aiohttp reads the rest for up to 10 s (lingering) so that a sender still writing gets the 413
        return error(413, f"body larger than {limits.max_bytes} bytes")
    codings = [c.strip().lower() for value in request.headers.getall(hdrs.CONTENT_ENCODING, [])
               for c in value.split(",") if c.strip()]
    if len(codings) > 1 or not set(codings) <= CONTENT_CODINGS:
        return await answer_and_close(request, error(
            400, f"unsupported Content-Encoding {', '.join(codings)!r}; send one of {', '.join(sorted(CONTENT_CODINGS))}"))
    try:
        async with asyncio.timeout(limits.read_timeout_seconds):
            raw = await request.read()
    except TimeoutError:
        return await answer_and_close(
            request, error(408, f"body not received within {limits.read_timeout_seconds:g} s"))
    except web.HTTPRequestEntityTooLarge:
        return error(413, f"body larger than {limits.max_bytes} bytes")
    except (web.RequestPayloadError, aiohttp.ClientError, ConnectionError) as exc:
        # A body that does not match its Content-Encoding or chunking, or a sender that went away.
        cause = exc.__cause__ or exc
        return await answer_and_close(
            request, error(400, f"unreadable body: {getattr(cause, 'message', None) or cause}"))
    try:
        signals, group_key = read_webhook(raw)
    except BodyError as exc:
        return error(400, str(exc))
    except PayloadError as exc:
        return error(422, str(exc))
    # Counted by the enum members (cheap to hash), each one's .value read once.
    for status, count in collections.Counter([s.status for s in signals]).items():
        setup.metrics.alerts_received.labels(status.value).inc(count)
    recorded = await svc.ingest_alerts(signals)
    if recorded.refused is Refusal.INVALID:  # cannot be stored however often it is sent: no retry
        return error(422, recorded.error)
    if recorded.refused is Refusal.BUSY:
        return error(503, "backlog full; retry", **{"Retry-After": "5"})
    if recorded.refused is Refusal.UNAVAILABLE:
        return error(503, "journal unavailable; retry", **{"Retry-After": "5"})
    log.info("webhook accepted", alerts=len(signals), new=recorded.new, duplicates=recorded.duplicates,
             group=group_key)
    return web.json_response({"accepted": recorded.new, "duplicates": recorded.duplicates})


async def healthz(request: web.Request) -> web.Response:
    """Liveness: ok unless a loop keeps crashing (restarts did not help); then 503, so that Kubernetes
    restarts the pod. A journal outage is not a reason: a restart would not fix it (readiness says it)."""
    trouble = request.app[SERVICE].liveness()
    if trouble is not None:
        return web.json_response({"status": "failing", "reason": trouble}, status=503)
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    detail = await request.app[SERVICE].readiness()
    return web.json_response(detail, status=200 if detail["ready"] else 503)


async def metrics(request: web.Request) -> web.Response:
    body = await request.app[SERVICE].scrape()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def expect_continue(request: web.Request) -> None:
    """`Expect: 100-continue` is answered as aiohttp does; any other expectation is ignored (RFC 9110
    allows that), so the request reaches the handlers and is counted instead of getting a 417 before
    them (and aiohttp then reading a broken body into its log)."""
    if request.headers.get(hdrs.EXPECT, "").strip().lower() == "100-continue":
        await _default_expect_handler(request)


def build_app(service: Daemon, setup: HttpSetup) -> web.Application:
    app = web.Application(client_max_size=setup.webhook.max_bytes, middlewares=[observe])
    app[SERVICE] = service
    app[SETUP] = setup
    app[IN_FLIGHT] = InFlight(setup.max_concurrent_webhooks)
    app.router.add_post("/api/v1/alerts", receive_alerts, expect_handler=expect_continue)
    app.router.add_get("/healthz", healthz, expect_handler=expect_continue)
    app.router.add_get("/readyz", readyz, expect_handler=expect_continue)
    app.router.add_get("/metrics", metrics, expect_handler=expect_continue)
    add_routes(app, service, expect_continue)
    return app
