"""The HTTP layer reaches the daemon only through named operations (`Daemon` in daemon/http/app.py):
the protocol is small and exchanges values, never the journal, the settings or a repository; and the
app, built on a fake daemon and served on loopback, answers each route from those operations alone,
never with a 500 but for a fault it counts."""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import http.client
import json
import socket
import threading
import types
import typing
from collections import abc
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence

import aiohttp
import pytest
import typing_extensions
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from policies.loader import PolicySet

from core.signal import Signal
from daemon.common.config import API_SCOPES, ApiTokenEntry
from daemon.common.metrics import Metrics
from daemon.http.api import Leadership
from daemon.http.app import Daemon, build_app
from daemon.http.auth import Credentials, TokenSet
from daemon.http.setup import BodyLimits, HttpSetup
from daemon.http.status import StatusInputs
from daemon.storage.errors import JournalError
from daemon.storage.records import DAEMON_SCOPE, FOREVER, BadVersionMark, EndedPin, Freeze
from daemon.workers.approvals import ApprovalOutcome, ApprovalResult
from daemon.workers.freezes import FreezeError, FreezeView
from daemon.workers.signal_intake import Recorded, Refusal
from tests.support.helpers import payload_with

HOOK, READER, WRITER = "hook-secret-0b1c", "reader-secret-9d2e", "writer-secret-4f7a"
NOW = 1_800_000_000.0
EXPLODE = "explode: " + "x" * 40  # the one reason the fake fails on (longer than the random ones)


# ---- the protocol ---------------------------------------------------------------------------------


def _classes(hint: Any) -> Iterator[Any]:
    """Every class a type hint names, through generics and unions."""
    origin = typing.get_origin(hint)
    if origin is None:
        yield hint
        return
    if origin not in (typing.Union, types.UnionType):
        yield origin
    for arg in typing.get_args(hint):
        yield from _classes(arg)


def _is_value(cls: Any) -> bool:
    """A value a call may carry: plain data, a dataclass, an enum, or the token set (a credential)."""
    plain = (type(None), bool, int, float, str, bytes, dict, list, tuple, set, frozenset, Any)
    return (cls in plain or cls in (abc.Sequence, abc.Mapping, TokenSet) or dataclasses.is_dataclass(cls)
            or (isinstance(cls, type) and issubclass(cls, enum.Enum)))


def test_the_daemon_protocol_is_at_most_15_named_operations_that_exchange_values() -> None:
    members = typing_extensions.get_protocol_members(Daemon)
    assert 0 < len(members) <= 15, sorted(members)
    assert not members & {"journal", "settings", "intake", "freezes", "executor", "repositories", "metrics"}
    for name in members:
        assert callable(getattr(Daemon, name)), f"{name} is an attribute, not an operation"
        hints = typing.get_type_hints(getattr(Daemon, name))
        for cls in (c for hint in hints.values() for c in _classes(hint)):
            assert _is_value(cls), f"{name} carries {cls!r}: not a value (journal, settings, repository?)"
            assert not getattr(cls, "__module__", "").startswith(("daemon.storage.journal", "daemon.common.config"))


def test_the_check_above_refuses_what_the_old_protocol_handed_out() -> None:
    """The value check is not vacuous: the journal, the settings, a repository and the freezes fail it."""
    from daemon.common.config import Settings
    from daemon.storage.journal import Journal
    from daemon.storage.pins import Pins
    from daemon.workers.freezes import FreezeControl
    from daemon.workers.signal_intake import SignalIntake

    assert not any(_is_value(c) for c in (Journal, Settings, Pins, FreezeControl, SignalIntake))
    assert all(_is_value(c) for c in (Freeze, Recorded, StatusInputs, ApprovalResult, Signal, Refusal))


# ---- a fake daemon --------------------------------------------------------------------------------


class FakeDaemon:
    """Answers the operations from memory; its fields set the situation a test needs."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.tokens = TokenSet([ApiTokenEntry("dashboards", READER, frozenset({"read"})),
                                ApiTokenEntry("alice", WRITER, frozenset(API_SCOPES))])
        self.acting, self.shared = True, False
        self.refusal: Refusal | None = None
        self.trouble: str | None = None
        self.ready = True
        self.journal_down = False
        self.ingested: list[Signal] = []
        self.freezes: list[Freeze] = []
        self.marks: dict[tuple[str, int], str] = {}
        self.pins: dict[str, EndedPin] = {"default/ranker": EndedPin(
            "default/ranker", "ranker", 1, NOW - 60, from_version=2, decision_id=7, id=1, ended_at=NOW,
            ended_reason="done")}
        self.recorded = 0

    def credentials(self) -> Credentials:
        return Credentials(HOOK, self.tokens)

    def may_answer(self, leader_only: bool) -> bool:
        return self.acting or (not leader_only and self.shared)

    async def leadership(self) -> Leadership:
        return Leadership(replica="tailguard-b", leader="tailguard-a")

    async def ingest_alerts(self, signals: Sequence[Signal]) -> Recorded:
        if self.refusal is not None:
            return Recorded(refused=self.refusal, error="bad row")
        self.ingested.extend(signals)
        return Recorded(new=len(signals))

    def liveness(self) -> str | None:
        return self.trouble

    async def readiness(self) -> dict[str, Any]:
        return {"ready": self.ready, "leader": self.acting}

    async def scrape(self) -> bytes:
        return generate_latest(self.metrics.registry)

    async def status(self) -> StatusInputs:
        if self.journal_down:
            raise JournalError("database is locked")
        return StatusInputs(now=NOW, replica="tailguard-b", leader=self.acting, acting=self.acting,
                            policies=PolicySet(), policies_loaded=True, last_reload_at=None,
                            last_reload_error=None, freezes=FreezeView(config=False))

    def _named(self, scope: str) -> None:
        if scope not in (DAEMON_SCOPE, "default/ranker"):
            raise FreezeError(422, f"target: no policy names {scope} (known: default/ranker)")

    async def freeze(self, scope: str, reason: str, by: str, duration_seconds: float | None) -> Freeze:
        self._named(scope)
        until = FOREVER if duration_seconds is None else NOW + duration_seconds
        self.freezes.append(Freeze(len(self.freezes) + 1, scope, reason, NOW, until, None, by=by, source="api"))
        return self.freezes[-1]

    async def unfreeze(self, scope: str, reason: str, by: str) -> list[Freeze]:
        if reason == EXPLODE:
            raise RuntimeError("unexpected\nsecond line")
        lifted = [f for f in self.freezes if f.target == scope]
        self.freezes = [f for f in self.freezes if f.target != scope]
        return [dataclasses.replace(f, lifted_at=NOW, lifted_reason=reason, lifted_by=by) for f in lifted]

    async def approve(self, approval_id: int, by: str, reason: str) -> ApprovalResult:
        return ApprovalResult(ApprovalOutcome.NOT_FOUND, f"no approval {approval_id}")

    async def bad_versions(self, target: str, include_cleared: bool) -> Sequence[BadVersionMark]:
        return [BadVersionMark(n, t, v, r, None, NOW) for n, ((t, v), r) in enumerate(sorted(self.marks.items()))
                if t == target]

    async def mark_bad_version(self, target: str, version: int, reason: str) -> bool:
        self._named(target)
        if (target, version) in self.marks:
            return False
        self.marks[(target, version)] = reason
        self.recorded += 1
        return True

    async def clear_bad_version(self, target: str, version: int, reason: str) -> bool:
        return self.marks.pop((target, version), None) is not None

    async def unpin(self, target: str, reason: str) -> EndedPin | None:
        return self.pins.pop(target, None)


def _setup(metrics: Metrics) -> HttpSetup:
    return HttpSetup(metrics=metrics, clock=lambda: NOW, webhook=BodyLimits(4096, 2.0), api=BodyLimits(2048, 2.0),
                     max_concurrent_webhooks=4, access_log="off")


def _app(fake: FakeDaemon) -> web.Application:
    daemon: Daemon = fake  # mypy checks that the fake has every operation, with its signature
    return build_app(daemon, _setup(fake.metrics))


class Served:
    def __init__(self, fake: FakeDaemon, http: aiohttp.ClientSession, port: int) -> None:
        self.fake, self.http, self.port = fake, http, port

    async def call(self, method: str, path: str, token: str | None = WRITER, body: Any = None,
                   raw: bytes | None = None) -> tuple[int, Any, Mapping[str, str]]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        async with self.http.request(method, f"http://127.0.0.1:{self.port}{path}", data=data,
                                     headers=headers) as resp:
            text = await resp.text()
            return (resp.status, json.loads(text) if resp.content_type == "application/json" else text,
                    dict(resp.headers))


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    fake = FakeDaemon(Metrics())
    runner = web.AppRunner(_app(fake), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http:
            yield Served(fake, http, port)
    finally:
        await runner.cleanup()


# ---- the webhook and the probes -------------------------------------------------------------------


async def test_the_webhook_journals_through_ingest_alerts_and_answers_its_refusals(served: Served) -> None:
    payload = payload_with(starts_at="2026-11-29T17:01:00Z")
    assert (await served.call("POST", "/api/v1/alerts", WRITER, payload))[0] == 401  # an API token is no webhook token
    status, body, _ = await served.call("POST", "/api/v1/alerts", HOOK, payload)
    assert (status, body) == (200, {"accepted": 1, "duplicates": 0})
    assert [s.name for s in served.fake.ingested] == [payload["alerts"][0]["labels"]["alertname"]]
    for refusal, code, retry in ((Refusal.BUSY, 503, "5"), (Refusal.UNAVAILABLE, 503, "5"), (Refusal.INVALID, 422, None)):
        served.fake.refusal = refusal
        status, body, headers = await served.call("POST", "/api/v1/alerts", HOOK, payload)
        assert (status, headers.get("Retry-After")) == (code, retry), body
    served.fake.refusal, served.fake.acting = None, False
    status, body, headers = await served.call("POST", "/api/v1/alerts", HOOK, payload)
    assert (status, body["error"], headers["Retry-After"]) == (503, "this replica is not the leader; retry", "5")
    served.fake.shared = True  # a journal the replicas share takes webhooks on a follower
    assert (await served.call("POST", "/api/v1/alerts", HOOK, payload))[0] == 200
    status, body, _ = await served.call("POST", "/api/v1/alerts", HOOK, raw=b"x" * 5000)
    assert (status, body["error"]) == (413, "body larger than 4096 bytes")  # the setup's limit


async def test_probes_answer_from_liveness_and_readiness_and_metrics_count_every_response(served: Served) -> None:
    assert (await served.call("GET", "/healthz"))[:2] == (200, {"status": "ok"})
    served.fake.trouble = "loop poller crashed 5 times"
    assert (await served.call("GET", "/healthz"))[:2] == (503, {"status": "failing", "reason": served.fake.trouble})
    assert (await served.call("GET", "/readyz"))[:2] == (200, {"ready": True, "leader": True})
    served.fake.ready = False
    assert (await served.call("GET", "/readyz"))[0] == 503
    status, text, headers = await served.call("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert 'tailguard_http_responses_total{code="503",route="/healthz"} 1.0' in text
    assert 'tailguard_http_responses_total{code="200",route="/readyz"} 1.0' in text


# ---- the operator API -----------------------------------------------------------------------------


async def test_api_gates_tokens_scopes_and_followers_before_any_operation(served: Served) -> None:
    assert (await served.call("POST", "/api/v1/freeze", None, {"reason": "x"}))[0] == 401
    assert (await served.call("POST", "/api/v1/freeze", HOOK, {"reason": "x"}))[0] == 401
    status, body, _ = await served.call("POST", "/api/v1/freeze", READER, {"reason": "x"})
    assert (status, body["error"]) == (403, "token 'dashboards' lacks the 'write' scope")
    served.fake.acting = False
    status, body, headers = await served.call("POST", "/api/v1/freeze", WRITER, {"reason": "x"})
    assert (status, body["leader"], body["replica"], headers["Retry-After"]) == (503, "tailguard-a", "tailguard-b", "2")
    served.fake.shared = True  # a shared journal: freeze is answered here, approve (acting) is not
    assert (await served.call("POST", "/api/v1/freeze", WRITER, {"reason": "x"}))[0] == 201
    assert (await served.call("POST", "/api/v1/approvals/1/approve", WRITER, {}))[0] == 503
    assert served.fake.freezes and served.fake.freezes[0].by == "alice"


async def test_freeze_unfreeze_approve_and_their_errors(served: Served) -> None:
    status, body, _ = await served.call("POST", "/api/v1/freeze", body={"target": "ranker", "reason": "hold",
                                                                       "durationSeconds": 60})
    frozen = body["frozen"]
    assert status == 201 and (frozen["scope"], frozen["by"], frozen["source"]) == ("default/ranker", "alice", "api")
    assert frozen["secondsLeft"] == 60.0  # rendered at the setup's clock
    status, body, _ = await served.call("POST", "/api/v1/freeze", body={"target": "typo", "reason": "hold"})
    assert (status, body["error"]) == (422, "target: no policy names default/typo (known: default/ranker)")
    assert (await served.call("POST", "/api/v1/freeze", body={"target": "Not A Target!", "reason": "x"}))[0] == 422
    status, body, _ = await served.call("POST", "/api/v1/unfreeze", body={"target": "ranker", "reason": "done"})
    assert status == 200 and [f["scope"] for f in body["lifted"]] == ["default/ranker"]
    status, body, _ = await served.call("POST", "/api/v1/approvals/7/approve", body={"reason": "go"})
    assert (status, body["error"]) == (404, "no approval 7")
    assert (await served.call("POST", "/api/v1/approvals/x7/approve", body={}))[0] == 404
    status, body, _ = await served.call("GET", "/api/v1/status", READER)
    assert (status, body["replica"], body["role"], body["targets"]) == (200, "tailguard-b", "leader", [])
    assert (await served.call("GET", "/api/v1/approvals", READER))[:2] == (200, {"approvals": []})
    served.fake.journal_down = True
    status, body, headers = await served.call("GET", "/api/v1/status", READER)
    assert (status, body["error"], headers["Retry-After"]) == (503, "journal unavailable; retry", "5")


async def test_bad_versions_and_unpin_through_their_operations(served: Served) -> None:
    mark = {"target": "ranker", "version": 3, "reason": "slow"}
    status, body, _ = await served.call("POST", "/api/v1/bad-versions/mark", body=mark)
    assert (status, body) == (201, {"marked": {"target": "default/ranker", "version": 3,
                                               "reason": "slow (by alice via api)"}})
    assert (await served.call("POST", "/api/v1/bad-versions/mark", body=mark))[0] == 409
    assert (await served.call("POST", "/api/v1/bad-versions/mark", body={**mark, "target": "typo"}))[0] == 422
    assert (await served.call("POST", "/api/v1/bad-versions/mark", body={"version": 3, "reason": "x"}))[0] == 422
    status, body, _ = await served.call("GET", "/api/v1/bad-versions?target=ranker", READER)
    assert status == 200 and [m["version"] for m in body["badVersions"]] == [3]
    clear = {"target": "ranker", "version": 3, "reason": "fixed"}
    assert (await served.call("POST", "/api/v1/bad-versions/clear", body=clear))[0] == 200
    assert (await served.call("POST", "/api/v1/bad-versions/clear", body=clear))[0] == 409
    status, body, _ = await served.call("POST", "/api/v1/unpin", body={"target": "ranker", "reason": "done"})
    assert (status, body) == (200, {"unpinned": {"target": "default/ranker", "version": 1, "fromVersion": 2,
                                                 "decision": 7}})
    assert (await served.call("POST", "/api/v1/unpin", body={"target": "ranker", "reason": "again"}))[0] == 409


async def test_an_operation_that_fails_unexpectedly_is_a_counted_json_500(served: Served) -> None:
    status, body, _ = await served.call("POST", "/api/v1/unfreeze", body={"reason": EXPLODE})
    assert (status, body) == (500, {"error": "internal error; the daemon's log has the details"})
    text = (await served.call("GET", "/metrics"))[1]
    assert 'tailguard_faults_total{component="http"} 1.0' in text
    assert 'tailguard_http_responses_total{code="500",route="/api/v1/unfreeze"} 1.0' in text


# ---- any input: an answer, not a 500 ----------------------------------------------------------------


class ThreadedApp:
    """The app on a fake daemon, on its own loop in a thread: hypothesis drives requests synchronously."""

    def __init__(self) -> None:
        self.fake = FakeDaemon(Metrics())
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(_app(self.fake), access_log=None)
        self._thread = threading.Thread(target=self._loop.run_forever, name="http-under-test", daemon=True)

    def __enter__(self) -> "ThreadedApp":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def send(self, data: bytes) -> tuple[int, bytes]:
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(data)
            response = http.client.HTTPResponse(sock)
            response.begin()
            return response.status, response.read()


_paths = st.sampled_from(["/api/v1/alerts", "/api/v1/status", "/api/v1/approvals", "/healthz", "/readyz", "/metrics", "/api/v1/freeze", "/api/v1/unfreeze",
                          "/api/v1/unpin", "/api/v1/approvals/1/approve", "/api/v1/approvals/%ff/approve",
                          "/api/v1/bad-versions?target=ranker", "/api/v1/bad-versions/mark",
                          "/api/v1/bad-versions/clear", "/api/v1/openapi.json", "/nowhere"])
_auth = st.sampled_from([f"Bearer {WRITER}", f"Bearer {READER}", f"Bearer {HOOK}", "Bearer", "", "Basic x",
                         "Bearer \udcff"])
_bodies = st.one_of(
    st.binary(max_size=200),
    st.fixed_dictionaries({}, optional={"target": st.one_of(st.text(max_size=20), st.integers(), st.none()),
                                        "reason": st.one_of(st.text(max_size=20), st.integers()),
                                        "version": st.one_of(st.integers(), st.text(max_size=4)),
                                        "durationSeconds": st.one_of(st.floats(), st.integers())})
    .map(lambda d: json.dumps(d).encode()),
    st.just(json.dumps(payload_with(starts_at="2026-11-29T17:02:00Z")).encode()),
)


@pytest.mark.slow
@pytest.mark.parametrize("acting, shared", [(True, False), (False, True), (False, False)])
def test_random_requests_to_every_route_never_get_a_500(acting: bool, shared: bool) -> None:
    with ThreadedApp() as app:
        app.fake.acting, app.fake.shared = acting, shared

        @given(st.sampled_from(["GET", "POST", "PUT"]), _paths, _auth, _bodies)
        @settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
        def check(method: str, path: str, auth: str, body: bytes) -> None:
            head = (f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
                    f"Authorization: {auth}\r\nConnection: close\r\n\r\n").encode("utf-8", "surrogateescape")
            status, raw = app.send(head + body)
            assert status < 500 or status == 503, (status, raw[:300])

        check()
        metrics = generate_latest(app.fake.metrics.registry).decode()
        assert 'code="500"' not in metrics and 'component="http"' not in metrics
