"""The daemon's operations for the HTTP app (daemon/wiring/operations.py) over a real journal: what
handlers used to do themselves (who may answer, the "a policy names this target" check, `until` from
a duration, publishing a changed record, reading the freezes before /readyz and /metrics) now done
once, behind named calls."""
from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from daemon.common.config import Settings
from daemon.common.metrics import Metrics
from daemon.http.auth import TokenSet
from daemon.http.status import StatusInputs
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE, FOREVER
from daemon.workers.approvals import ApprovalOutcome, ApprovalResult
from daemon.workers.freezes import FreezeControl, FreezeError
from daemon.workers.signal_intake import SignalIntake
from daemon.wiring.operations import DaemonOperations, http_setup

KNOWN = "default/ranker"
NOW = float(int(time.time()))


class Approvals:
    async def approve(self, approval_id: int, by: str, reason: str) -> ApprovalResult:
        return ApprovalResult(ApprovalOutcome.NOT_FOUND, f"no approval {approval_id} ({by}: {reason})")


class FakeService:
    """The service's side of the operations, over a real journal and freeze control."""

    def __init__(self, journal: Journal) -> None:
        self.settings = Settings()
        self.metrics = Metrics()
        self.clock = lambda: NOW
        self.identity = "tailguard-b"
        self.webhook_token: str | None = "hook"
        self.api_tokens = TokenSet([])
        self.journal = journal
        self.intake = SignalIntake(journal, self.metrics)
        self.published = 0
        self.freezes = FreezeControl(journal, self.metrics, False, on_recorded=self.state_recorded, clock=self.clock)
        self.executor = Approvals()
        self.acting = True

    def may_act(self) -> bool:
        return self.acting

    async def leader_identity(self) -> str | None:
        return "tailguard-a"

    async def status_inputs(self) -> StatusInputs:
        raise AssertionError("not called here")

    def known_targets(self) -> set[str]:
        return {KNOWN}

    def state_recorded(self) -> None:
        self.published += 1

    def loop_trouble(self) -> str | None:
        return None

    def readiness(self) -> dict[str, Any]:
        return {"ready": True, "frozen": self.freezes.last.frozen}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[FakeService]:
    journal = Journal(tmp_path / "journal.db")
    try:
        yield FakeService(journal)
    finally:
        journal.close()


@pytest.mark.parametrize("acting, shared, leader_only, answers", [
    (True, False, True, True), (True, True, False, True),
    (False, True, False, True),  # a journal the replicas share: a follower answers reads and writes to it
    (False, True, True, False),  # but not what only the leader may do (approve: it acts)
    (False, False, False, False),  # a journal of its own: a follower's view is stale
])
def test_may_answer(acting: bool, shared: bool, leader_only: bool, answers: bool) -> None:
    service = SimpleNamespace(may_act=lambda: acting, journal=SimpleNamespace(shared=shared))
    assert DaemonOperations(service).may_answer(leader_only) is answers


async def test_credentials_are_read_per_call_and_leadership_names_both(service: FakeService) -> None:
    ops = DaemonOperations(service)
    assert ops.credentials().webhook_token == "hook"
    service.webhook_token = "rotated"  # the secret reloader swaps the service's tokens
    assert ops.credentials().webhook_token == "rotated"
    who = await ops.leadership()
    assert (who.replica, who.leader) == ("tailguard-b", "tailguard-a")


async def test_freeze_only_a_named_target_until_now_plus_the_duration(service: FakeService) -> None:
    ops = DaemonOperations(service)
    with pytest.raises(FreezeError) as refused:
        await ops.freeze("default/typo", "hold", "alice", None)
    assert (refused.value.status, str(refused.value)) == (422, "target: no policy names default/typo (known: default/ranker)")
    assert await service.journal.freezes.all.in_thread("*") == []
    freeze = await ops.freeze(KNOWN, "hold", "alice", 60)
    assert (freeze.target, freeze.until, freeze.by, freeze.source) == (KNOWN, NOW + 60, "alice", "api")
    daemon = await ops.freeze(DAEMON_SCOPE, "all", "alice", None)  # the whole daemon needs no policy
    assert daemon.until == FOREVER
    lifted = await ops.unfreeze(KNOWN, "done", "alice")
    assert [f.id for f in lifted] == [freeze.id]


async def test_a_changed_record_is_published_and_an_unchanged_one_is_not(service: FakeService) -> None:
    ops = DaemonOperations(service)
    with pytest.raises(FreezeError):
        await ops.mark_bad_version("default/typo", 3, "slow")
    assert await ops.mark_bad_version(KNOWN, 3, "slow") is True
    assert await ops.mark_bad_version(KNOWN, 3, "slow") is False
    assert [m.version for m in await ops.bad_versions(KNOWN, include_cleared=False)] == [3]
    assert service.published == 1
    assert await ops.clear_bad_version(KNOWN, 3, "fixed") is True
    assert await ops.clear_bad_version(KNOWN, 3, "fixed") is False
    assert service.published == 2
    assert await ops.bad_versions(KNOWN, include_cleared=False) == []
    assert len(await ops.bad_versions(KNOWN, include_cleared=True)) == 1
    assert await ops.unpin(KNOWN, "none") is None
    await service.journal.pins.record.in_thread(KNOWN, "ranker", 1, from_version=2)
    ended = await ops.unpin(KNOWN, "done")
    assert ended is not None and ended.version == 1 and service.published == 3


async def test_readiness_and_scrape_read_the_freezes_first_and_survive_a_journal_failure(
        service: FakeService, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = DaemonOperations(service)
    await service.journal.freezes.record.in_thread(DAEMON_SCOPE, "by hand", FOREVER, by="cli", source="cli")
    assert await ops.readiness() == {"ready": True, "frozen": True}  # seen without a freeze call here

    async def down(*_: Any) -> Any:
        raise JournalError("database is locked")

    monkeypatch.setattr(service.freezes, "view", down)
    assert (await ops.readiness())["frozen"] is True  # the last view stays
    text = (await ops.scrape()).decode()
    assert 'tailguard_faults_total{component="journal"} 2.0' in text
    assert "tailguard_frozen_daemon 1.0" in text


def test_http_setup_takes_the_limits_from_the_settings_once() -> None:
    settings = Settings()
    setup = http_setup(settings, Metrics(), lambda: NOW)
    assert (setup.webhook.max_bytes, setup.webhook.read_timeout_seconds) == (
        settings.webhook.max_body_bytes, settings.webhook.body_read_timeout_seconds)
    assert (setup.api.max_bytes, setup.api.read_timeout_seconds) == (
        settings.api.max_body_bytes, settings.api.body_read_timeout_seconds)
    assert (setup.max_concurrent_webhooks, setup.access_log) == (settings.webhook.max_concurrent_requests,
                                                                 settings.log.access)
