"""What the journal needs from a database: one connection's worth of statements inside a
transaction, the few SQL fragments that differ per database, and versioned migrations.

The journal's repositories (daemon/storage/signals.py, pins.py ...) write their SQL once, with `?`
placeholders, in the subset that SQLite and PostgreSQL share; a backend runs it and supplies the rest."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

# Where a journal announces newly journaled signals (PostgreSQL NOTIFY; daemon/storage/journal_notices.py).
SIGNALS_CHANNEL = "tailguard_signals"

# A result row: read by column name (sqlite3.Row, or a dict from psycopg).
Row = Mapping[str, Any]

# The table that says which migrations a journal has had; the same DDL on both databases.
MIGRATIONS_TABLE = ("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
                    " description TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")


class UnstorableText(ValueError):
    """A text value this database cannot store (PostgreSQL: a NUL character); the same value fails
    again, so the journal reports it as a value error, not as an outage."""


class SchemaTooNew(RuntimeError):
    """The journal was migrated by a newer tailguard: refuse rather than write rows it does not know."""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Backend(Protocol):
    """One database behind the journal. Not thread-safe: the journal serializes calls with its
    lock (reads too, unless `concurrent_reads`)."""

    name: str
    """sqlite | postgres"""
    concurrent_reads: bool
    """query() may run beside a transaction (it takes its own connection)."""
    errors_abort_transaction: bool
    """A failed statement spoils the whole transaction (PostgreSQL): isolate it in a savepoint."""
    json_ids: str
    """A subquery yielding the integers of a JSON array given as its one `?` parameter."""
    share_lock: str
    """Appended to a SELECT of one row inside a transaction: hold it against updates until commit."""

    def json_text(self, column: str, key: str) -> str:
        """SQL for the text of `key` in the JSON object stored as text in `column`."""
        ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run one statement: inside the open transaction, else on its own (committed at once)."""
        ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    def execute_script(self, script: str) -> None:
        """Several `;`-separated statements without parameters (schema DDL), in the open transaction."""
        ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one read."""
        ...

    def begin(self) -> None: ...

    def commit(self) -> None: ...

    def rollback(self) -> None:
        """Roll back the open transaction, if any; never raises for a connection already gone."""
        ...

    @property
    def in_transaction(self) -> bool: ...

    def lock_schema(self) -> None:
        """Inside the migration transaction: keep other processes from migrating at the same time."""
        ...

    def migrate(self) -> int:
        """Apply this backend's pending migrations; the schema version reached."""
        ...

    def announce(self, channel: str, payload: str) -> None:
        """Inside a transaction: tell listeners of `channel` once it commits (PostgreSQL NOTIFY).
        A no-op where no other process listens (SQLite: one process per journal)."""
        ...

    def describe(self) -> str:
        """Where the journal lives, fit for logs (no password)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Migration:
    """One schema version: a DDL script, then an optional step that needs to look first (columns
    that older journals lack). Never edit a released migration: add the next version."""

    version: int
    description: str
    script: str
    then: Callable[[Backend], None] | None = None


def apply_migrations(backend: Backend, migrations: Sequence[Migration]) -> int:
    """Bring the journal to the last of `migrations` in one transaction (under the backend's
    schema lock, so replicas starting together migrate once). Returns the version reached.

    Raises:
        SchemaTooNew: the journal has a version this code does not know.
    """
    known = max(m.version for m in migrations)
    backend.begin()
    try:
        backend.lock_schema()
        backend.execute(MIGRATIONS_TABLE)
        row = backend.execute("SELECT MAX(version) AS v FROM schema_migrations").fetchone()
        current = int(row["v"] or 0) if row is not None else 0
        if current > known:
            raise SchemaTooNew(f"journal schema version {current} is newer than this tailguard's ({known}); "
                               "upgrade tailguard")
        for m in sorted(migrations, key=lambda m: m.version):
            if m.version <= current:
                continue
            backend.execute_script(m.script)
            if m.then is not None:
                m.then(backend)
            backend.execute("INSERT INTO schema_migrations(version, description, applied_at) VALUES (?, ?, ?)",
                            (m.version, m.description, time.time()))
        backend.commit()
    except BaseException:
        backend.rollback()
        raise
    return max(current, known)


def statements(script: str) -> list[str]:
    """The statements of a DDL script: `--` comments dropped, split on `;` (DDL here has no
    semicolons inside literals)."""
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
