"""Which backend a journal store names: a PostgreSQL URI, else a SQLite file."""
from __future__ import annotations

from pathlib import Path

from daemon.storage.backend import Backend


def is_postgres(store: Path | str) -> bool:
    """Whether `store` names a PostgreSQL database (a postgres:// or postgresql:// URI)."""
    return isinstance(store, str) and store.startswith(("postgres://", "postgresql://"))


def connect(store: Path | str | Backend, busy_timeout_seconds: float = 5.0, pool_size: int = 4, *,
            statement_timeout_seconds: float | None = None) -> Backend:
    """The backend for `store`: a PostgreSQL URI, else a SQLite file (a backend passes through).
    `statement_timeout_seconds`: PostgreSQL's bound on one statement (None: its default)."""
    if not isinstance(store, (str, Path)):
        return store
    if is_postgres(store):
        # Imported here: a SQLite-only install never loads the PostgreSQL driver.
        from daemon.storage.postgres_backend import DEFAULT_STATEMENT_TIMEOUT_SECONDS, PostgresBackend

        return PostgresBackend(str(store), pool_size=pool_size, connect_timeout_seconds=busy_timeout_seconds,
                               statement_timeout_seconds=statement_timeout_seconds or DEFAULT_STATEMENT_TIMEOUT_SECONDS)
    from daemon.storage.sqlite_backend import SqliteBackend

    return SqliteBackend(store, busy_timeout_seconds)
