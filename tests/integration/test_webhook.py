"""The Alertmanager webhook against the running daemon: statuses for bad input, journaling, dedup."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import TOKEN, NotifySink, local_settings, notify_policy, payload_with, post_alerts, sample_payload, wait_for

POLICY = notify_policy("{url}")


@pytest.fixture
async def service(tmp_path: Path, sink: NotifySink) -> AsyncIterator[Service]:
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "p.yaml").write_text(POLICY.replace("{url}", sink.url))
    svc = Service(local_settings(tmp_path, pol, webhook={"maxBodyBytes": 4096}), action_registry(),
                  detector_registry())
    async with svc:
        yield svc


async def test_sample_payload_is_journaled_then_acted_on(service: Service, sink: NotifySink):
    """The real Alertmanager body is accepted, journaled, matched and acted on (notify sent)."""
    status, body = await post_alerts(service, json.dumps(sample_payload()).encode())
    assert (status, body) == (200, {"accepted": 1, "duplicates": 0})
    await wait_for(lambda: len(sink.received) == 1)
    await service.drain()
    (sig,) = await service.journal.signals.all.in_thread()
    assert sig.state == "processed" and sig.name == "TritonTailLatencyHigh"
    (decision,) = await service.journal.decisions.all.in_thread()
    assert decision.state == "succeeded" and decision.policy == "ranker-notify"
    assert sink.received[0]["signal"]["labels"]["model"] == "ranker"


async def test_resend_of_the_same_group_is_deduplicated(service: Service, sink: NotifySink):
    """Alertmanager resends groups: same fingerprint + startsAt is journaled and acted on once."""
    raw = json.dumps(sample_payload()).encode()
    assert (await post_alerts(service, raw))[1]["accepted"] == 1
    assert (await post_alerts(service, raw))[1] == {"accepted": 0, "duplicates": 1}
    await service.drain()
    assert len(await service.journal.signals.all.in_thread()) == 1
    assert len(sink.received) == 1


async def test_resolved_alert_is_journaled_but_not_acted_on(service: Service, sink: NotifySink):
    """Resolved alerts trigger only where a policy asks for them (includeResolved)."""
    status, body = await post_alerts(service, json.dumps(sample_payload("alertmanager_webhook_v4_resolved.json")).encode())
    assert status == 200 and body["accepted"] == 1
    await service.drain()
    assert sink.received == []
    assert await service.journal.decisions.all.in_thread() == []


async def test_newer_alertmanager_fields_are_tolerated(service: Service):
    """Fields newer Alertmanagers add (notification_reason, routeLabels, custom keys) are accepted."""
    body = sample_payload()
    body["notification_reason"] = "first_notification"
    body["routeLabels"] = {"team": "ml"}
    body["alerts"][0]["somethingNew"] = {"x": 1}
    assert (await post_alerts(service, json.dumps(body).encode()))[0] == 200


@pytest.mark.parametrize(
    ("raw", "token", "status", "reason"),
    [
        (b'{"version": "4", "alerts": [', TOKEN, 400, "malformed JSON"),
        (b"\xff\xfe", TOKEN, 400, "malformed JSON"),
        (json.dumps({**sample_payload(), "version": "3"}).encode(), TOKEN, 422, "unsupported webhook version"),
        (json.dumps({**sample_payload(), "alerts": []}).encode(), TOKEN, 422, "alerts"),
        (json.dumps([1, 2]).encode(), TOKEN, 422, "JSON object"),
        (json.dumps(payload_with(status="exploded")).encode(), TOKEN, 422, "status"),
        (json.dumps(sample_payload()).encode(), None, 401, "bearer token"),
        (json.dumps(sample_payload()).encode(), "wrong", 401, "bearer token"),
        (b"{" + b" " * 8192 + b"}", TOKEN, 413, "larger than"),
    ],
    ids=["truncated", "not-utf8", "version", "no-alerts", "array", "bad-status", "no-token",
         "bad-token", "too-large"],
)
async def test_bad_input_gets_its_status_and_journals_nothing(service: Service, raw: bytes,
                                                              token: str | None, status: int, reason: str):
    """Each kind of bad input gets its 4xx with a short reason; the journal stays empty."""
    got, body = await post_alerts(service, raw, token=token)
    assert got == status
    assert reason in body["error"] and "\n" not in body["error"]
    assert await service.journal.signals.all.in_thread() == []


@pytest.mark.slow
async def test_journal_unavailable_answers_503_so_alertmanager_retries(service: Service, tmp_path: Path,
                                                                      sink: NotifySink):
    """When the journal cannot be written (another process holds the lock), answer 503, act on nothing;
    the same alert sent again later is accepted."""
    service.journal._db.execute("PRAGMA busy_timeout = 200")
    locker = sqlite3.connect(str(tmp_path / "journal.db"), isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        status, body = await post_alerts(service, json.dumps(sample_payload()).encode())
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert status == 503 and "retry" in body["error"]
    assert sink.received == []
    status, body = await post_alerts(service, json.dumps(sample_payload()).encode())
    assert (status, body["accepted"]) == (200, 1)
    await wait_for(lambda: len(sink.received) == 1)


async def test_health_ready_and_metrics(service: Service):
    """/healthz answers, /readyz is ready once policies load, /metrics counts webhooks and alerts."""
    await post_alerts(service, json.dumps(sample_payload()).encode())
    await service.drain()
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{service.port}"
        async with http.get(base + "/healthz") as r:
            assert r.status == 200
        async with http.get(base + "/readyz") as r:
            detail = await r.json()
            assert r.status == 200 and detail["policies"] == 1
        async with http.get(base + "/metrics") as r:
            text = await r.text()
    assert 'tailguard_webhooks_total{code="200"} 1.0' in text
    assert 'tailguard_http_responses_total{code="200",route="/api/v1/alerts"} 1.0' in text
    assert 'tailguard_http_responses_total{code="200",route="/healthz"} 1.0' in text
    assert 'tailguard_alerts_received_total{status="firing"} 1.0' in text
    assert 'tailguard_actions_total{action="notify",result="succeeded"} 1.0' in text


async def test_not_ready_without_valid_policies(tmp_path: Path):
    """With invalid policies at start the daemon runs but is not ready, and says why."""
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "p.yaml").write_text("name: x\n")
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{svc.port}/readyz") as r:
                detail = await r.json()
    assert r.status == 503 and not detail["ready"]
    assert "target" in detail["last_reload_error"]


async def test_reload_refuses_an_alert_only_policy_without_verify_and_keeps_the_active_set(service: Service):
    """Editing the policy into one that acts on alerts only without a verify block: the reload is
    refused with the loader's one-line error naming the policy and `verify`, the active set stays."""
    active = service.state.policies
    path = service.settings.policies.path / "p.yaml"
    text = path.read_text()
    path.write_text(text[:text.index("verify:")])  # the same policy without its verify block
    await service.reload_policies()
    assert service.state.policies is active
    error = service.last_reload_error or ""
    assert "\n" not in error
    assert error.startswith(f"{path}: policy 'ranker-notify': verify: required: this policy acts on alerts only")
    path.write_text(text)  # fixed: valid again, nothing to swap
    await service.reload_policies()
    assert service.state.policies is active and service.last_reload_error is None


async def test_port_in_use_fails_start_cleanly(tmp_path: Path, service: Service):
    """A second daemon on a taken port fails to start with OSError and leaves no task behind
    (the autouse leak check would fail the test otherwise)."""
    pol = tmp_path / "policies"
    settings = local_settings(tmp_path / "second", pol, listen={"host": "127.0.0.1", "port": service.port})
    with pytest.raises(OSError):
        async with Service(settings, action_registry(), detector_registry()):
            pass
