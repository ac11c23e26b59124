"""Opening a journal from the command line: the one a file or DSN argument names, else the one the
settings name; every failure is one line (exit 2 for bad settings, 1 for a journal that is missing,
cannot be opened or fails), and the journal is always closed."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from daemon.common.config import ConfigError, load_settings
from daemon.wiring.cli.records import CommandFailed

if TYPE_CHECKING:
    from daemon.storage.journal import Journal


def is_dsn(text: str) -> bool:
    return text.startswith(("postgres://", "postgresql://"))


def existing_store(config: Path | None, given: str | None = None) -> Path | str:
    """The journal `given` names (a file or a DSN), else the one the settings at `config` name.

    Raises:
        CommandFailed: bad settings (exit 2), a journal file that does not exist (exit 1).
    """
    from daemon.common.config import journal_store

    try:
        store: Path | str = journal_store(load_settings(config).journal) if given is None else (
            given if is_dsn(given) else Path(given))
    except ConfigError as exc:
        raise CommandFailed(f"error: {exc}", 2) from None
    if isinstance(store, Path) and not store.exists():
        raise CommandFailed(f"error: no journal at {store}")
    return store


@contextlib.contextmanager
def open_journal(store: Path | str) -> Iterator["Journal"]:
    """The journal at `store`, closed on the way out.

    Raises:
        CommandFailed: (exit 1) the journal cannot be opened, or fails while in use.
    """
    from daemon.storage.errors import JournalError
    from daemon.storage.journal import Journal

    try:
        journal = Journal(store)
    except JournalError as exc:
        raise CommandFailed(f"error: {exc}") from None
    try:
        yield journal
    except JournalError as exc:
        raise CommandFailed(f"error: {exc}") from None
    finally:
        journal.close()


def settings_journal(config: Path | None) -> contextlib.AbstractContextManager["Journal"]:
    """The journal the settings at `config` name (operator commands on the pod itself)."""
    return open_journal(existing_store(config))
