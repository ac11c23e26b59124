"""Journal notices on a real PostgreSQL: a replica's committed signals wake another replica's
listener, not its own; nothing wakes it for a rolled-back or duplicate write; a broken connection
is an error the next wait recovers from. SQLite has none."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest

from core.signal import Signal, SignalSource
from daemon.storage.errors import JournalBackpressure, JournalError
from daemon.storage.journal import Journal
from daemon.storage.signals import DEFAULT_MAX_PENDING
from daemon.storage.journal_notices import JournalNotices, notices_for


def _signal(key: str) -> Signal:
    return Signal(SignalSource.ALERT, "A", {"model": "m"}, datetime.now(timezone.utc), key)


@asynccontextmanager
async def _replicas(dsn: str, follower_max_pending: int = DEFAULT_MAX_PENDING) -> AsyncIterator[tuple[Journal, Journal, JournalNotices]]:
    """Two journals on one database (the leader's, a follower's) and the leader's notices; closed after."""
    leader, follower = Journal(dsn), Journal(dsn, max_pending=follower_max_pending)
    notices = notices_for(leader)
    assert notices is not None
    try:
        yield leader, follower, notices
    finally:
        await notices.close()
        leader.close()
        follower.close()


@pytest.mark.integration
async def test_another_replicas_signals_wake_the_listener_and_its_own_do_not(postgres_dsn: str):
    async with _replicas(postgres_dsn) as (leader, follower, notices):
        assert await notices.wait(0.2) is False  # connected and listening; nothing yet
        leader.signals.record([_signal("own")])
        assert await notices.wait(0.5) is False  # its own write is no news

        started = time.monotonic()
        waiting = asyncio.create_task(notices.wait(30))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await asyncio.to_thread(follower.signals.record, [_signal("theirs")])
        assert await asyncio.wait_for(waiting, 10) is True
        assert time.monotonic() - started < 10  # woken by the commit, not by the 30 s timeout

        follower.signals.record([_signal("theirs")])  # a duplicate: nothing new, no notice
        assert await notices.wait(0.5) is False


@pytest.mark.integration
async def test_a_commit_after_listen_returns_is_heard_by_the_next_wait(postgres_dsn: str):
    """The leader listens, then counts the backlog, then waits: a commit between the count and the
    wait must not be lost."""
    async with _replicas(postgres_dsn) as (_, follower, notices):
        await notices.listen()
        follower.signals.record([_signal("between")])
        assert await notices.wait(5) is True


@pytest.mark.integration
async def test_no_notice_for_a_write_that_did_not_commit(postgres_dsn: str):
    async with _replicas(postgres_dsn, follower_max_pending=0) as (_, follower, notices):
        assert await notices.wait(0.1) is False
        try:
            follower.signals.record([_signal("refused")])
        except JournalBackpressure:
            pass
        else:
            raise AssertionError("max_pending=0 must refuse the write")
        assert await notices.wait(0.5) is False


@pytest.mark.integration
async def test_a_dropped_connection_is_an_error_and_the_next_wait_listens_again(postgres_dsn: str):
    async with _replicas(postgres_dsn) as (_, follower, notices):
        assert await notices.wait(0.1) is False
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:  # what a database failover does to it
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()")
        failed = False
        try:
            await notices.wait(1.0)
        except JournalError as exc:
            failed = "journal notices" in str(exc)
        assert failed
        assert await notices.wait(0.1) is False  # connected again
        follower.signals.record([_signal("after")])
        assert await notices.wait(5) is True


def test_sqlite_has_no_notices(tmp_path: Path):
    journal = Journal(tmp_path / "j.db")
    try:
        assert journal.dsn is None and notices_for(journal) is None
        journal.signals.record([_signal("x")])  # announcing is a no-op there
    finally:
        journal.close()
