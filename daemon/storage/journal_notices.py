"""Wake-ups for the leader on a shared PostgreSQL journal.

Every replica takes webhooks; only the leader acts, and signals another replica journaled never
reach its in-memory backlog. Each transaction that journals new signals sends a NOTIFY on
SIGNALS_CHANNEL (PostgreSQL delivers it at commit, never for a rolled-back one) with the sending
journal's instance id, and the leader LISTENs on a connection of its own: it reads the shared
backlog as soon as another replica committed, instead of at its next poll. The poll stays as the
backstop (a notice lost with a dropped connection is caught by it).
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any

from daemon.storage.backend import SIGNALS_CHANNEL
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal

if TYPE_CHECKING:
    import psycopg


def notices_for(journal: Journal) -> JournalNotices | None:
    """A listener for the signals other replicas journal in `journal` (PostgreSQL), else None."""
    return None if journal.dsn is None else JournalNotices(journal.dsn, journal.instance)


class JournalNotices:
    """LISTEN on SIGNALS_CHANNEL; `wait` returns once another journal instance's signals committed.

    Args:
        dsn: The journal's PostgreSQL connection string.
        own: This process's journal instance id: its own notices are not news to it.
        connect_timeout_seconds: How long connecting may take.
    """

    def __init__(self, dsn: str, own: str, connect_timeout_seconds: float = 10.0) -> None:
        self._dsn, self._own, self._connect_timeout = dsn, own, connect_timeout_seconds
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def listen(self) -> None:
        """LISTEN from now on, if not already: every commit after this returns is heard by a
        later `wait` (one before it is not, so count the backlog after this, not before). Raises
        JournalError as `wait` does."""
        async with self._journal_errors():
            await self._connected()

    async def wait(self, timeout: float) -> bool:
        """True once another replica's signals are committed (notices queued since the last call
        count), False after `timeout` seconds without one. Raises JournalError when the
        connection cannot be made or breaks; the next call connects again."""
        async with self._journal_errors():
            conn = await self._connected()
            # Closed on the way out, not left to the collector: the generator holds the connection's lock.
            async with aclosing(conn.notifies(timeout=timeout)) as notices:
                async for notice in notices:
                    if notice.payload != self._own:
                        return True
            return False

    @asynccontextmanager
    async def _journal_errors(self) -> AsyncIterator[None]:
        """A database error as JournalError, the connection closed so that the next call connects again."""
        import psycopg  # here, as the backend: a SQLite-only run never loads the PostgreSQL driver

        try:
            yield
        except psycopg.Error as exc:
            await self.close()
            raise JournalError(f"journal notices: {type(exc).__name__}: {exc}") from exc

    async def _connected(self) -> psycopg.AsyncConnection[Any]:
        import psycopg

        if self._conn is None or self._conn.closed:
            conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True,
                                                         connect_timeout=max(1, round(self._connect_timeout)))
            await conn.execute(f"LISTEN {SIGNALS_CHANNEL}")
            self._conn = conn
        return self._conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            import psycopg

            try:
                await conn.close()
            except psycopg.Error:
                pass  # gone already
