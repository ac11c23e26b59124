"""Small helpers shared by tests: settings for a local service, webhook payloads, a notify sink."""
from __future__ import annotations

import asyncio
import copy
import json
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from daemon.common.config import Settings
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


def local_settings(tmp: Path, policies: Path, **overrides: Any) -> Settings:
    raw: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "policies": {"path": str(policies), "reloadIntervalSeconds": 0.2},
        "journal": {"path": str(tmp / "journal.db")},
        "executor": {"workers": 2},
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


async def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> None:
    """Poll `predicate` until true; bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met within timeout")
        await asyncio.sleep(interval)
