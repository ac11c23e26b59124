"""Approval on a real daemon on loopback: a policy with `approval: required` journals its plan and
waits; approved (CLI or API, a write token) it runs; past its deadline it expires and does not;
both journaled and notified, the notification carrying the command and the call (no link that
approves by itself). Pending approvals survive a restart."""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from daemon.wiring.cli import main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.integration.test_operator_api import OPERATOR, READER, TOKENS, alert, call
from tests.support.helpers import NotifySink, local_settings, notify_policy

POLICY = notify_policy("{url}", extra="approval: required\napprovalTimeoutSeconds: 600\n")


@pytest.fixture(autouse=True)
def api_tokens_env() -> Iterator[None]:
    os.environ["TAILGUARD_API_TOKENS"] = TOKENS
    yield
    os.environ.pop("TAILGUARD_API_TOKENS", None)


class Clock:
    """Unix time the test moves forward (deadlines), starting now."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _service(tmp_path: Path, action_url: str, events_url: str, clock: Clock) -> Service:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "p.yaml").write_text(POLICY.replace("{url}", action_url))
    settings = local_settings(tmp_path, pol, notifications=[{"url": events_url}],
                              api={"externalUrl": "https://tailguard.example:8443"})
    return Service(settings, action_registry(), detector_registry(), clock=clock)


def _events(sink: NotifySink, kind: str) -> list[dict[str, Any]]:
    return [e for e in sink.received if e.get("event") == kind]


async def _notified(svc: Service) -> None:
    await svc.parts.notifier.flush()


async def test_approved_plan_runs_journaled_and_notified(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plan waits (blocked, awaiting approval 1; nothing sent); a second signal meanwhile adds no
    second approval; `tailguard approve 1` runs it: the decision succeeds and says who approved."""
    clock = Clock()
    async with NotifySink() as actions, NotifySink() as events:
        async with _service(tmp_path, actions.url, events.url, clock) as svc:
            await alert(svc, 0)
            (decision,) = await svc.journal.decisions.all.in_thread()
            assert decision.state == "blocked" and decision.reason.startswith("awaiting approval 1 until ")
            await alert(svc, 1)
            second = (await svc.journal.decisions.all.in_thread())[-1]
            assert second.state == "blocked" and second.reason.startswith("awaiting approval 1 (decision 1)")
            pending = await svc.journal.approvals.all.in_thread("pending")
            assert [a.id for a in pending] == [1] and actions.received == []
            await _notified(svc)
            (requested,) = _events(events, "approval_requested")
            assert requested["approval"] == 1 and requested["decision"] == 1
            assert requested["command"].startswith("tailguard approve 1 --url https://tailguard.example:8443")
            assert "https://tailguard.example:8443/api/v1/approvals/1/approve" in requested["call"]
            assert "Bearer <a token with the write scope>" in requested["call"]
            assert OPERATOR not in str(requested) and READER not in str(requested)
            doc = (await call(svc, "GET", "/api/v1/status", READER))[1]
            assert doc["approvals"][0]["id"] == 1 and doc["targets"][0]["policies"][0]["pendingApproval"] == 1

            assert (await call(svc, "POST", "/api/v1/approvals/1/approve", READER, {}))[0] == 403
            token_file = tmp_path / "token"
            token_file.write_text(OPERATOR)
            code = await asyncio.to_thread(main, ["approve", "1", "--reason", "looks right", "--url",
                                                  f"http://127.0.0.1:{svc.port}", "--token-file", str(token_file)])
            assert code == 0 and "approval 1 approved by alice" in capsys.readouterr().out
            await svc.executor.wait_approved()
            assert len(actions.received) == 1
            decision = await svc.journal.decisions.get.in_thread(1)
            assert decision is not None and decision.executed and decision.state == "succeeded"
            assert decision.reason == "1 step(s) applied and verified"
            approval = await svc.journal.approvals.get.in_thread(1)
            assert approval is not None and (approval.status, approval.decided_by, approval.reason) == \
                ("approved", "alice", "looks right")
            await _notified(svc)
            assert _events(events, "approved")[0]["by"] == "alice"
            assert _events(events, "acted")[0]["decision"] == 1
            again = await call(svc, "POST", "/api/v1/approvals/1/approve", OPERATOR, {})
            assert again[0] == 409 and "approved by alice, not pending" in again[1]["error"]


async def test_without_an_external_url_notifications_name_the_port_the_api_listens_on(tmp_path: Path) -> None:
    """listen.port 0: the port is known only once the API listens; the approval notifications (the
    request and its expiry) name that one, read when each is made."""
    clock = Clock()
    async with NotifySink() as actions, NotifySink() as events:
        pol = tmp_path / "policies"
        pol.mkdir()
        (pol / "p.yaml").write_text(POLICY.replace("{url}", actions.url))
        settings = local_settings(tmp_path, pol, notifications=[{"url": events.url}])
        async with Service(settings, action_registry(), detector_registry(), clock=clock) as svc:
            assert svc.port
            await alert(svc, 0)
            clock.now += 601
            await svc.approvals.expire_due()
            await _notified(svc)
            url = f"http://127.0.0.1:{svc.port}"
            for kind in ("approval_requested", "approval_expired"):
                (note,) = _events(events, kind)
                assert note["command"].startswith(f"tailguard approve 1 --url {url} ")
                assert f"{url}/api/v1/approvals/1/approve" in note["call"]


async def test_expired_plan_does_not_run_journaled_and_notified(tmp_path: Path) -> None:
    """Past its deadline the approval expires (journaled, notified with the command and the call); the
    plan never runs and approving it then is refused (409)."""
    clock = Clock()
    async with NotifySink() as actions, NotifySink() as events:
        async with _service(tmp_path, actions.url, events.url, clock) as svc:
            await alert(svc, 0)
            clock.now += 601
            (expired,) = await svc.approvals.expire_due()
            approval = await svc.journal.approvals.get.in_thread(1)
            assert expired.id == 1 and approval is not None and approval.status == "expired"
            decision = await svc.journal.decisions.get.in_thread(1)
            assert decision is not None and decision.state == "blocked" and not decision.executed
            assert decision.reason.startswith("approval 1 expired at ")
            status, body = await call(svc, "POST", "/api/v1/approvals/1/approve", OPERATOR, {})
            assert status == 409 and "expired" in body["error"]
            await _notified(svc)
            (note,) = _events(events, "approval_expired")
            assert note["approval"] == 1 and "tailguard approve 1" in note["command"] and "/approve" in note["call"]
            assert actions.received == []
            # The next signal asks again (a new approval), since none is pending any more.
            await alert(svc, 1)
            assert [a.id for a in await svc.journal.approvals.all.in_thread("pending")] == [2]


async def test_pending_approval_survives_a_restart_and_a_freeze_keeps_it_waiting(tmp_path: Path) -> None:
    """Journaled before a restart, approved after it: it runs. Approving while the daemon is frozen is
    refused (409) and leaves it pending."""
    clock = Clock()
    async with NotifySink() as actions, NotifySink() as events:
        async with _service(tmp_path, actions.url, events.url, clock) as svc:
            await alert(svc, 0)
        async with _service(tmp_path, actions.url, events.url, clock) as svc:
            assert [a.id for a in await svc.journal.approvals.all.in_thread("pending")] == [1]
            assert (await call(svc, "POST", "/api/v1/freeze", OPERATOR, {"reason": "hold"}))[0] == 201
            status, body = await call(svc, "POST", "/api/v1/approvals/1/approve", OPERATOR, {"reason": "go"})
            assert status == 409 and "stays pending: daemon frozen: hold" in body["error"]
            assert (await call(svc, "POST", "/api/v1/unfreeze", OPERATOR, {}))[0] == 200
            status, body = await call(svc, "POST", "/api/v1/approvals/1/approve", OPERATOR, {"reason": "go"})
            assert status == 202 and body["approval"]["status"] == "approved"
            await svc.executor.wait_approved()
            decision = await svc.journal.decisions.get.in_thread(1)
            assert len(actions.received) == 1 and decision is not None and decision.state == "succeeded"
