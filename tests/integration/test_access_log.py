"""The access log: one line per request with method, path, status, duration, remote and the
token's name, never a body, a query string or a token; probes at debug; `log.access: off` writes
none."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import TOKEN, local_settings, notify_policy, payload_with, post_alerts

pytestmark = pytest.mark.integration

API_TOKEN = "ops-token-0123456789abcdef"


def _access(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("event") == "request" and "route" in e]


async def test_every_request_is_logged_without_bodies_or_secrets(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILGUARD_API_TOKENS", f"- {{name: ops, token: {API_TOKEN}, scopes: [read]}}")
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(notify_policy("http://127.0.0.1:9/hook"))
    async with Service(local_settings(tmp_path, policies), action_registry(), detector_registry()) as svc:
        base = f"http://127.0.0.1:{svc.port}"
        with capture_logs() as logs:
            await post_alerts(svc, payload_with(fingerprint="secret-fingerprint"), expect=200)
            await post_alerts(svc, payload_with(fingerprint="f2"), token="wrong", expect=401)
            async with aiohttp.ClientSession() as http:
                async with http.get(base + "/api/v1/status?x=hidden", headers={"Authorization": f"Bearer {API_TOKEN}"}):
                    pass
                async with http.get(base + "/healthz"):
                    pass
        lines = _access(logs)
        got = [(e["method"], e["path"], e["status"], e["token"], e["log_level"]) for e in lines]
        assert got == [("POST", "/api/v1/alerts", 200, "webhook", "info"),
                       ("POST", "/api/v1/alerts", 401, None, "info"),
                       ("GET", "/api/v1/status", 200, "ops", "info"),
                       ("GET", "/healthz", 200, None, "debug")], got
        assert all(e["duration_ms"] >= 0 and e["remote"] == "127.0.0.1" for e in lines)
        text = json.dumps(lines)
        for secret in (TOKEN, API_TOKEN, "secret-fingerprint", "hidden", "wrong"):
            assert secret not in text


async def test_access_log_off_writes_none(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(notify_policy("http://127.0.0.1:9/hook"))
    settings = local_settings(tmp_path, policies, log={"access": "off"})
    async with Service(settings, action_registry(), detector_registry()) as svc:
        with capture_logs() as logs:
            await post_alerts(svc, payload_with(fingerprint="f1"), expect=200)
        assert _access(logs) == []
