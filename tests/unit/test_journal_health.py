"""The journal's write health (JournalCore.write_health): failing streaks, a stalled write, the
bounded wait for the journal's lock, and the probe. SQLite, with a backend that fails or stalls
on demand (what a full disk or a hung file system does)."""
from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal
from daemon.storage.sqlite_backend import SqliteBackend


def wait_for_sync(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met within timeout"
        time.sleep(0.01)


class FaultyBackend(SqliteBackend):
    """SQLite whose commit fails while `failing`, and blocks while `stalled` is clear."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failing = False
        self.stalled = threading.Event()
        self.stalled.set()

    def commit(self) -> None:
        self.stalled.wait(30)
        if self.failing:
            raise sqlite3.OperationalError("disk I/O error")
        super().commit()


@pytest.fixture
def faulty(tmp_path: Path) -> FaultyBackend:
    return FaultyBackend(tmp_path / "j.db")


def test_a_healthy_journal_reports_no_trouble(faulty: FaultyBackend) -> None:
    """Writes that commit leave no failing streak; the probe commits too and counts no commit."""
    journal = Journal(faulty)
    try:
        journal.freezes.record("ns/m", "x", 1e12)
        journal.probe()
        assert journal.write_health().error is None
        assert journal.write_health().trouble(0.0) is None
        assert journal.commits == 1
    finally:
        journal.close()


def test_failing_writes_are_trouble_once_they_fail_past_the_bound_and_a_commit_ends_it(faulty: FaultyBackend) -> None:
    """The streak starts at the first failure and is trouble past the bound; one commit clears it."""
    journal = Journal(faulty)
    try:
        faulty.failing = True
        with pytest.raises(JournalError):
            journal.freezes.record("ns/m", "x", 1e12)
        health = journal.write_health()
        assert health.error is not None and "disk I/O error" in health.error
        assert health.trouble(3600.0) is None  # not yet past the bound
        assert "journal writes failing for" in str(health.trouble(0.0))
        with pytest.raises(JournalError):
            journal.probe()  # the probe fails the same way and keeps the streak
        assert journal.write_health().error is not None
        faulty.failing = False
        journal.probe()
        assert journal.write_health().error is None
    finally:
        journal.close()


def test_a_value_the_database_refuses_is_no_outage(faulty: FaultyBackend) -> None:
    """Text that cannot be stored fails the same way every time: not counted against the journal."""
    journal = Journal(faulty)
    try:
        with pytest.raises(JournalError):
            journal.freezes.record("ns/m", "bad \ud800", 1e12)
        assert journal.write_health().error is None
    finally:
        journal.close()


def test_a_stalled_write_is_trouble_before_it_fails_and_waiters_fail_within_the_lock_bound(
        faulty: FaultyBackend) -> None:
    """A write that hangs (no error yet) counts as failing from when it began once it ran past
    the stall bound; a second write waits at most lock_timeout_seconds for the lock, then fails
    as busy instead of queueing behind it for ever."""
    journal = Journal(faulty, statement_timeout_seconds=0.2, lock_timeout_seconds=0.3)
    faulty.stalled.clear()
    errors: list[Exception] = []

    def write() -> None:
        try:
            journal.freezes.record("ns/m", "x", 1e12)
        except JournalError as exc:
            errors.append(exc)

    stuck = threading.Thread(target=write)
    stuck.start()
    try:
        wait_for_sync(lambda: journal.write_health().error is not None, timeout=10)
        assert "in progress" in str(journal.write_health().error)
        began = time.monotonic()
        with pytest.raises(JournalError, match="journal busy"):
            journal.probe()
        assert time.monotonic() - began < 10  # bounded (0.3 s asked), not blocked behind the stalled write
        assert journal.write_health().trouble(0.1) is not None
    finally:
        faulty.stalled.set()
        stuck.join(10)
        journal.close()
    assert errors == []  # it committed once released


def test_repositories_stamp_rows_with_the_journals_clock(tmp_path: Path) -> None:
    """The clock the daemon compares windows with is the one rows are stamped with."""
    journal = Journal(tmp_path / "j.db", clock=lambda: 1234.5)
    try:
        freeze = journal.freezes.record("ns/m", "x", 2000.0)
        assert journal.freezes.all()[0].at == 1234.5, freeze
    finally:
        journal.close()


async def test_a_replica_whose_sqlite_journal_cannot_be_written_turns_not_ready_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe finds the failing journal without a signal needing it: /readyz answers 503 with
    the reason and tailguard_journal_up is 0; once writes commit again it is ready again."""
    import aiohttp

    from daemon.wiring.registries import action_registry, detector_registry
    from daemon.wiring.service import Service
    from tests.support.helpers import local_settings, wait_for

    policies = tmp_path / "policies"
    policies.mkdir()
    settings = local_settings(tmp_path, policies, journal={"path": str(tmp_path / "j.db"), "writeFailureSeconds": 0.2,
                                                            "probeIntervalSeconds": 0.05})
    async with Service(settings, action_registry(), detector_registry()) as svc:
        backend = svc.journal._db
        original = backend.commit
        broken = [True]

        def commit() -> None:
            if broken[0]:
                raise sqlite3.OperationalError("database or disk is full")
            original()

        monkeypatch.setattr(backend, "commit", commit)

        async def readyz() -> tuple[int, dict[str, object]]:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{svc.port}/readyz") as resp:
                    return resp.status, await resp.json()

        await wait_for(lambda: svc.journal_trouble() is not None, timeout=10)
        status, body = await readyz()
        assert status == 503 and "database or disk is full" in str(body["journal_error"]), body
        assert svc.metrics.registry.get_sample_value("tailguard_journal_up") == 0
        broken[0] = False
        await wait_for(lambda: svc.journal_trouble() is None, timeout=10)
        status, body = await readyz()
        assert status == 200 and body["journal_error"] is None, body
