"""The journal under test on each backend: `open_journal` opens the same store every call (a
SQLite file in tmp_path, or this test's fresh PostgreSQL database), so a test can reopen it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from daemon.storage.journal import Journal

# PostgreSQL runs as a server process: its cases are integration tests, the SQLite ones unit tests.
BACKENDS = ("sqlite", pytest.param("postgres", marks=pytest.mark.integration))
OpenJournal = Callable[..., Journal]


@pytest.fixture(params=BACKENDS)
def journal_store(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """A SQLite file, or a PostgreSQL DSN (the test is skipped where PostgreSQL is not installed;
    marked integration)."""
    if request.param == "sqlite":
        return tmp_path / "j.db"
    return str(request.getfixturevalue("postgres_dsn"))


@pytest.fixture
def open_journal(journal_store: Path | str) -> Iterator[OpenJournal]:
    """Journal(store, **kwargs) on this test's store; whatever it opened is closed after the test."""
    opened: list[Journal] = []

    def open_(**kwargs: Any) -> Journal:
        journal = Journal(journal_store, **kwargs)
        opened.append(journal)
        return journal

    yield open_
    for journal in opened:
        journal.close()
