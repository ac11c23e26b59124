"""The journal's core, under every repository: the database behind one lock, transactions, reads,
the fencing check of the acting path, and the checks and codec of what is stored."""
from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol, Sequence, TypeVar

import msgspec

from daemon.storage.backend import Backend, Row, UnstorableText
from daemon.storage.errors import JournalError, JournalFenced, JournalValueError
from daemon.storage.factory import connect, is_postgres
from daemon.storage.records import Term

T = TypeVar("T")

DEFAULT_STALLED_AFTER_SECONDS = 5.0
"""Without a statement timeout given: a write in progress this long counts as failing."""


class Dialect(Protocol):
    """The SQL fragments that differ per database, for a repository's reads (the backend's own)."""

    @property
    def json_ids(self) -> str: ...

    @property
    def share_lock(self) -> str: ...

    def json_text(self, column: str, key: str) -> str: ...


@dataclass(frozen=True)
class WriteHealth:
    """How the journal's writes fare, as `JournalCore.write_health` sees them now.

    A write that fails with a database error (not a value the database refuses, not a fenced
    write: the database answered those) starts a failing streak; the next committed write ends it.
    A write still in progress counts as failing from when it began once it has run longer than
    `stalled_after_seconds`: a write stalled on a silent network does not fail until it is cut.
    """

    failing_seconds: float
    """How long writes have been failing (0.0: the last write committed, or none ran yet)."""
    error: str | None
    """The last failure, or what is stalled; None while healthy."""

    def trouble(self, bound_seconds: float) -> str | None:
        """Why the journal counts as unavailable at `bound_seconds` of failing writes, or None."""
        if self.error is None or self.failing_seconds < bound_seconds:
            return None
        return f"journal writes failing for {self.failing_seconds:.1f}s: {self.error}"


class JournalCore:
    """One database (daemon/storage/backend.py) behind one lock. Thread-safe; the repositories of
    the journal hold it and use only its public face: `write` and `fenced_write` (a transaction,
    handed the database), `read`, `sql` (the fragments that differ per database), `hold` (the
    term fenced writes check), `opening`, `exclusive` and `joined`.

    Args:
        store: A SQLite file (or ":memory:"), a postgres:// or postgresql:// URI, or a backend.
        busy_timeout_seconds: How long SQLite waits for a lock, PostgreSQL for a connection.
        statement_timeout_seconds: PostgreSQL: the server's statement_timeout, and the client's
            cut of a statement left unanswered past it (daemon/storage/postgres_backend.py).
            None: the backend's default.
        lock_timeout_seconds: The longest a write waits for the journal's lock while another
            write is in progress; then it fails (JournalError) instead of queueing without bound.
            None: no bound.
        clock: Unix time for the rows' stamps (the daemon's clock: its windows compare with them).
    """

    def __init__(self, store: Path | str | Backend, busy_timeout_seconds: float = 5.0, *,
                 statement_timeout_seconds: float | None = None, lock_timeout_seconds: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.commits = 0  # committed write transactions (tests and benchmarks count them)
        # Names this process's notices on a shared journal, so that its own are not news to it.
        self.instance = uuid.uuid4().hex
        self.clock = clock
        self._lock = threading.Lock()
        self._lock_timeout = -1.0 if lock_timeout_seconds is None else lock_timeout_seconds
        # Write health (`write_health`), in monotonic time: the failing streak's start and last
        # error, and when the write holding the lock began.
        self._failing_since: float | None = None
        self._last_error: str | None = None
        self._writing_since: float | None = None
        self._tx_thread: int | None = None  # the thread whose transaction is in progress (`joined`)
        self._last_ok = -float("inf")
        self._stalled_after = (statement_timeout_seconds if statement_timeout_seconds is not None
                               else DEFAULT_STALLED_AFTER_SECONDS)
        try:
            self._db: Backend = connect(store, busy_timeout_seconds, statement_timeout_seconds=statement_timeout_seconds)
        except Exception as exc:  # unreachable database, bad DSN, unwritable folder: not a crash
            raise JournalError(f"cannot open the journal: {type(exc).__name__}: {exc}") from exc
        # The SQLite file, None on PostgreSQL.
        self.path: Path | None = Path(store) if isinstance(store, (str, Path)) and not is_postgres(store) else None
        self._opening(self._db.migrate)
        # This process's term once it took one (Terms.take); every fenced write checks it is still
        # the journal's. Kept after leadership is lost: an in-flight write must still be checked.
        self._fence: Term | None = None

    def _opening(self, step: Callable[[], T]) -> T:
        """A step of opening the journal (migrating, the first counts): when it fails, the database
        is closed and an Exception comes out as JournalError naming the journal."""
        try:
            return step()
        except BaseException as exc:
            self._db.close()
            if isinstance(exc, Exception) and not isinstance(exc, JournalError):
                raise JournalError(f"journal {self._db.describe()}: {type(exc).__name__}: {exc}") from exc
            raise

    @property
    def backend(self) -> str:
        """sqlite | postgres"""
        return self._db.name

    @property
    def shared(self) -> bool:
        """Whether several replicas may write this journal at once (PostgreSQL): each accepts
        webhooks into it, and the one that acts must look for signals the others journaled."""
        return self._db.name == "postgres"

    @property
    def dsn(self) -> str | None:
        """The PostgreSQL connection string (journal_notices listens there); None on SQLite."""
        dsn = getattr(self._db, "dsn", None)
        return dsn if self._db.name == "postgres" and isinstance(dsn, str) else None

    def describe(self) -> str:
        """Where the journal lives (a file, or the DSN without its password)."""
        return self._db.describe()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- the repositories' interface --------------------------------------------------------

    def write(self, fn: Callable[[Backend], T], after_commit: Callable[[T], None] | None = None) -> T:
        """Run `fn` with the database in one transaction (see `_tx`); its result."""
        return self._tx(lambda: fn(self._db), after_commit)

    def fenced_write(self, fn: Callable[[Backend], T], after_commit: Callable[[T], None] | None = None) -> T:
        """`write` of the acting path: refused (JournalFenced) when this process holds a term and
        another has taken a newer one."""
        return self._tx(lambda: fn(self._db), after_commit, fenced=True)

    @property
    def sql(self) -> Dialect:
        """The SQL fragments that differ per database, for reads built outside a transaction."""
        return self._db

    def opening(self, step: Callable[[Backend], T]) -> T:
        """A step of opening the journal, run with the database (see `_opening`)."""
        return self._opening(lambda: step(self._db))

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the journal's lock: no transaction runs meanwhile, nor an `after_commit`. For what a
        repository keeps beside the database and updates after its commits (a count)."""
        with self._lock:
            yield

    def joined(self, fn: Callable[[Backend], T]) -> T:
        """Run `fn` with the database inside the transaction this thread has in progress (a check
        that runs inside another repository's write: a shard's term), else in a `write` of its own."""
        if self._tx_thread == threading.get_ident():
            return fn(self._db)
        return self.write(fn)

    def _tx(self, fn: Callable[[], T], after_commit: Callable[[T], None] | None = None, *,
            fenced: bool = False) -> T:
        """Run `fn` in one transaction. Whatever it raises rolls the transaction back: an Exception
        comes out as JournalError (JournalValueError for text the database cannot store), anything
        else (cancellation, KeyboardInterrupt) unchanged. `after_commit` runs with the result once
        committed, still under the lock. `fenced`: a write of the acting path, refused
        (JournalFenced) when this process holds a term and another has taken a newer one.
        Waiting for the lock is bounded by `lock_timeout_seconds` (JournalError past it)."""
        self._acquire()
        try:
            self._writing_since = time.monotonic()
            self._tx_thread = threading.get_ident()
            try:
                if self._db.in_transaction:  # a rollback that failed earlier: never build on it
                    self._db.rollback()
                self._db.begin()
                if fenced:
                    self._check_fence()
                result = fn()
                self._db.commit()
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, JournalError) or not isinstance(exc, Exception):
                    if isinstance(exc, JournalFenced):
                        self._wrote()  # the database answered: with a newer term than ours
                    raise
                error = journal_error(exc)
                if not isinstance(error, JournalValueError):
                    self._write_failed(self._writing_since, str(error))
                raise error from exc
            self.commits += 1
            self._wrote()
            if after_commit is not None:
                after_commit(result)
            return result
        finally:
            self._writing_since = None
            self._tx_thread = None
            self._lock.release()

    def _acquire(self) -> None:
        """Take the journal's lock within `lock_timeout_seconds`, else fail as a write that could not run."""
        if self._lock.acquire(timeout=self._lock_timeout):
            return
        since = self._writing_since
        held = f" for {time.monotonic() - since:.1f}s" if since is not None else ""
        error = f"journal busy: another write has been in progress{held}"
        self._write_failed(time.monotonic() - max(self._lock_timeout, 0.0), error)
        raise JournalError(error)

    # ---- write health ------------------------------------------------------------------------

    def _wrote(self) -> None:
        self._failing_since, self._last_error = None, None
        self._last_ok = time.monotonic()

    def _write_failed(self, began: float, error: str) -> None:
        if self._failing_since is None or began < self._failing_since:
            self._failing_since = began
        self._last_error = error

    def write_health(self) -> WriteHealth:
        """How the journal's writes fare now (see WriteHealth); never blocks, never touches the database."""
        now = time.monotonic()
        since, error = self._failing_since, self._last_error
        writing = self._writing_since
        if writing is not None and now - writing > self._stalled_after:
            if since is None or writing < since:
                since = writing
            error = error or f"a write has been in progress for {now - writing:.1f}s"
        if since is None or error is None:
            return WriteHealth(0.0, None)
        return WriteHealth(max(0.0, now - since), error)

    def seconds_since_write(self) -> float:
        """Seconds since a write last committed (inf: none yet)."""
        return time.monotonic() - self._last_ok

    def probe(self) -> None:
        """One empty write transaction (begin, a statement, commit): what a replica without writes
        of its own learns the journal's health from. Not counted in `commits`. Raises JournalError."""
        self._acquire()
        try:
            self._writing_since = time.monotonic()
            try:
                if self._db.in_transaction:
                    self._db.rollback()
                self._db.begin()
                self._db.execute("SELECT 1")
                self._db.commit()
            except BaseException as exc:
                self._rollback()
                if not isinstance(exc, Exception):
                    raise
                error = journal_error(exc)
                self._write_failed(self._writing_since, str(error))
                raise error from exc
            self._wrote()
        finally:
            self._writing_since = None
            self._lock.release()

    def _rollback(self) -> None:
        self._db.rollback()  # never raises: the next _tx rolls back again before it begins

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """The rows of one read, outside any transaction (JournalError when it fails)."""
        if self._db.concurrent_reads:
            try:
                return self._db.query(sql, params)
            except Exception as exc:
                raise JournalError(f"journal read failed: {type(exc).__name__}: {exc}") from exc
        self._acquire_for_read()
        try:
            return self._db.query(sql, params)
        except Exception as exc:
            raise JournalError(f"journal read failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._lock.release()

    def _acquire_for_read(self) -> None:
        if not self._lock.acquire(timeout=self._lock_timeout):
            raise JournalError("journal busy: a write has been in progress too long to read beside it")

    # ---- fencing ------------------------------------------------------------------------------

    @property
    def fence(self) -> Term | None:
        """The term this process took last (None: it never acted under leader election)."""
        return self._fence

    def hold(self, term: Term) -> None:
        """From now on, fenced writes are refused once another process takes a newer term than `term`."""
        self._fence = term

    def _check_fence(self) -> None:
        fence = self._fence
        if fence is None:
            return
        row = self._db.execute("SELECT term, holder FROM leadership WHERE id=1" + self._db.share_lock).fetchone()
        if row is None or int(row["term"]) != fence.term:
            now = "none" if row is None else f"{row['term']} ({row['holder']})"
            raise JournalFenced(f"term {fence.term} of {fence.holder} was replaced by term {now}: "
                                "this replica no longer acts; write refused")


def checked(**fields: object) -> None:
    """Raise JournalValueError naming the first text field SQLite could not store: text that is
    not encodable as UTF-8 (a lone surrogate such as "\\ud800" from a JSON escape)."""
    for name, value in fields.items():
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise JournalValueError(f"{name}: not storable as UTF-8 text ({exc.reason} at position "
                                        f"{exc.start})") from exc


def journal_error(exc: Exception) -> JournalError:
    """A database failure as the journal's error: text the database cannot store fails the same
    way again (JournalValueError), anything else may pass (JournalError)."""
    if isinstance(exc, UnstorableText):
        return JournalValueError(str(exc))
    return JournalError(f"journal write failed: {type(exc).__name__}: {exc}")


_PAYLOAD_DECODER = msgspec.json.Decoder()


def decode_payload(text: str) -> dict[str, Any]:
    """A signal's journaled summary. msgspec reads it in less than half json's time (a backlog read
    after a restart decodes every pending row) and gives the same values; what it refuses and json
    reads (NaN, a number past a double's range, a lone surrogate, escaped or not) goes to json."""
    try:
        value = _PAYLOAD_DECODER.decode(text)
    except (msgspec.DecodeError, UnicodeEncodeError):
        value = json.loads(text)
    return value  # type: ignore[no-any-return]
