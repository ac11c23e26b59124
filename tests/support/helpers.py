"""Small helpers shared by tests: settings for a local service, webhook payloads and posting them,
a notify sink."""
from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from daemon.common.config import Settings
from daemon.wiring.service import Service
from lab.policies import example_policy, triton_endpoints
from tests.support.paths import SAMPLES

TOKEN = "test-token-3f9c"


def notify_policy(url: str, guards: str = "cooldown: 0s", extra: str = "") -> str:
    """The policy most daemon tests run: TritonTailLatencyHigh about model ranker -> notify `url`,
    under `guards` (YAML flow mapping body). Alert-only policies need a verify block; this one's
    outcome is irrelevant (no Prometheus: unknown, and onNotRecovered none freezes nothing)."""
    return f"""
name: ranker-notify
target: {{model: ranker}}
triggers:
  - alert: {{name: TritonTailLatencyHigh}}
actions:
  - type: notify
    url: {url}
guards: {{{guards}}}
verify: {{query: 'vector(0)', below: 1, onNotRecovered: none}}
{extra}"""


def sample_payload(name: str = "alertmanager_webhook_v4.json") -> dict[str, Any]:
    return json.loads((SAMPLES / name).read_text())


def payload_with(starts_at: str | None = None, model: str | None = None, fingerprint: str | None = None,
                 status: str | None = None) -> dict[str, Any]:
    body = copy.deepcopy(sample_payload())
    alert = body["alerts"][0]
    if starts_at:
        alert["startsAt"] = starts_at
    if model:
        alert["labels"]["model"] = model
    if fingerprint:
        alert["fingerprint"] = fingerprint
    if status:
        alert["status"] = status
        body["status"] = status
    return body


class Answer(tuple[int, Any]):
    """The webhook's answer: unpacks and compares as (status, JSON body: None when not JSON), and
    has `status`, `body`, `headers` and `text` by name."""

    headers: Mapping[str, str]
    text: str

    def __new__(cls, status: int, body: Any, headers: Mapping[str, str], text: str) -> "Answer":
        answer = super().__new__(cls, (status, body))
        answer.headers, answer.text = headers, text
        return answer

    @property
    def status(self) -> int:
        return int(self[0])

    @property
    def body(self) -> Any:
        return self[1]


async def post_alerts(svc: Service, body: dict[str, Any] | bytes, *, token: str | None = TOKEN,
                      headers: Mapping[str, str] | None = None, expect: int | None = None,
                      drain: bool = False) -> Answer:
    """POST `body` to the daemon's webhook (/api/v1/alerts) as Alertmanager does: a dict as JSON,
    bytes as they are (Content-Type application/json either way), with the bearer `token` (None:
    no Authorization header) and `headers` on top. `expect`: fail unless the status is that one;
    `drain`: then wait until the daemon has processed every signal journaled so far."""
    sent = {"Content-Type": "application/json", "User-Agent": "Alertmanager/0.25.0"}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    sent.update(headers or {})
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{svc.port}/api/v1/alerts", data=data, headers=sent) as resp:
            raw = await resp.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            answer = Answer(resp.status, parsed, resp.headers.copy(), raw.decode("utf-8", "replace"))
    if expect is not None:
        assert answer.status == expect, answer.text
    if drain:
        await svc.drain()
    return answer


NO_BLAST_RADIUS: dict[str, Any] = {"maxTargetsPerWindow": None, "commonCauseTargets": None, "commonCauseShare": None}
"""The blastRadius settings of a daemon under test, unless the test asks for them: on by default, common
cause holds every signal a span (60 s) before it acts, which tests of other things would only wait out."""


def local_settings(tmp: Path, policies: Path, **overrides: Any) -> Settings:
    raw: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "policies": {"path": str(policies), "reloadIntervalSeconds": 0.2},
        "journal": {"path": str(tmp / "journal.db")},
        "executor": {"workers": 2},
        "blastRadius": NO_BLAST_RADIUS,
    }
    raw.update(overrides)
    os.environ["TAILGUARD_WEBHOOK_TOKEN"] = TOKEN
    return Settings.model_validate(raw)


class NotifySink:
    """A real HTTP endpoint on loopback that records what the `notify` action posts."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self.status = 200

    async def _handle(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        return web.Response(status=self.status)

    async def __aenter__(self) -> "NotifySink":
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def example_backtest_settings(tmp: Path, example: str, prometheus_url: str) -> Settings:
    """Settings for backtesting examples/policies/`example` over `prometheus_url`: written into
    `tmp/policies` with only its Triton endpoints filled in (unreachable: a backtest never calls them)."""
    pol = tmp / "policies"
    pol.mkdir()
    triton = triton_endpoints("http://127.0.0.1:9", "http://127.0.0.1:9/metrics")
    (pol / example).write_text(example_policy(example, target={"triton": triton}))
    return local_settings(tmp, pol, prometheus={"url": prometheus_url})


async def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> None:
    """Poll `predicate` until true; bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met within timeout")
        await asyncio.sleep(interval)


class FakeTimer:
    """Fake unix time shared by everything a test hands `now` and `sleep`: a sleeper wakes once the
    test has advanced the time past its deadline (`advance`), however many sleep at once."""

    def __init__(self, start: float) -> None:
        self.now = start
        self.slept: list[float] = []
        self._moved = asyncio.Condition()

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        deadline = self.now + delay
        async with self._moved:
            await self._moved.wait_for(lambda: self.now >= deadline)

    async def advance(self, seconds: float) -> None:
        """Move the time on and let every sleeper whose deadline passed wake."""
        self.now += seconds
        async with self._moved:
            self._moved.notify_all()
        await asyncio.sleep(0)

    async def run_until(self, done: "asyncio.Future[Any]", step: float, limit: float,
                        real_pause: float = 0.005) -> None:
        """Advance by `step` (with a short real pause for the journal's threads) until `done` is
        done; fails once `limit` seconds of fake time have passed without it."""
        end = self.now + limit
        while not done.done():
            if self.now > end:
                raise AssertionError(f"not done within {limit:g}s of fake time")
            await self.advance(step)
            await asyncio.sleep(real_pause)
        await done


async def stop_load_after(load: list["asyncio.Future[Any]"], since: float, seconds: float) -> None:
    """Let the load tasks run until `seconds` after `since` (the event loop's clock), then cancel
    them and wait for them to end: a healthy deploy watched for a while, not for the whole bound."""
    await asyncio.sleep(max(0.0, since + seconds - asyncio.get_running_loop().time()))
    for task in load:
        task.cancel()
    await asyncio.gather(*load, return_exceptions=True)
