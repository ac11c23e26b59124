"""The journal: every signal, decision, step and outcome, written before it is acknowledged. It is
the source of truth for dedup, cooldowns and pins after a restart. One API and one set of SQL on
two databases (daemon/storage/sqlite_backend.py embedded, postgres_backend.py shared)."""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, Concatenate, Generic, Iterable, ParamSpec, Sequence, TypeVar

import msgspec

from core.decision import DecisionState
from core.signal import Signal
from daemon.storage.backend import SIGNALS_CHANNEL, Backend, Row, UnstorableText

P = ParamSpec("P")
T = TypeVar("T")
B = TypeVar("B")
R = TypeVar("R")

# What recording signals returns: (id, signal) of the new ones, and how many were duplicates.
Recorded = tuple[list[tuple[int, Signal]], int]
# Called with the (id, signal) of the new ones once they are committed.
OnCommit = Callable[[list[tuple[int, Signal]]], None]

DEFAULT_MAX_PENDING = 100_000
INSERT_CHUNK = 1_000  # rows per INSERT statement (6 parameters each, under SQLite's 32,766)

DAEMON_SCOPE = "*"  # the freezes row `target` of a freeze on the whole daemon (every target)
FOREVER = 253402300799.0  # 9999-12-31T23:59:59Z: the `until` of a freeze that lasts until lifted

RECOVERY = "recovery"  # the phase (and action) of a decision's recovery rows: pending, then the verdict



@dataclass(frozen=True)
class StoredSignal:
    id: int
    dedup_key: str
    payload: dict[str, Any]
    state: str
    received_at: float = 0.0  # unix time it was journaled (the age that expires it)


@dataclass(frozen=True)
class Decision:
    id: int
    signal_id: int
    policy: str
    target: str
    at: float
    state: DecisionState
    reason: str
    plan: dict[str, Any]
    executed: bool


@dataclass(frozen=True)
class Freeze:
    id: int
    target: str
    reason: str
    at: float
    until: float
    decision_id: int | None
    lifted_at: float | None = None
    lifted_reason: str | None = None
    by: str | None = None  # who froze: a token name, a ConfigMap's field manager; None: tailguard itself
    source: str | None = None  # api | cli | configmap | escalation (None: escalation or imported)
    lifted_by: str | None = None


@dataclass(frozen=True)
class Approval:
    """A plan waiting for an operator (`approval: required`), or what became of it."""

    id: int
    decision_id: int
    policy: str
    target: str
    requested_at: float
    deadline: float
    status: str  # pending | approved | expired
    decided_at: float | None = None
    decided_by: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class SharedState:
    """What the cluster state shares besides live pins and guard marks (Journal.shared_state,
    Journal.merge_cluster_state); times are unix seconds."""

    pin_ends: tuple[tuple[str, float, float, str], ...] = ()  # (target, the pin's at, ended_at, reason)
    bad_marks: tuple[tuple[str, int, str, float], ...] = ()  # (target, version, reason, at), in force
    bad_clears: tuple[tuple[str, int, float, str], ...] = ()  # (target, version, cleared_at, reason)
    freezes: tuple[tuple[str, str, float, float], ...] = ()  # (target, reason, at, until), in force
    lifts: tuple[tuple[str, float, str, float], ...] = ()  # (target, lifted_at, reason, latest until lifted)


@dataclass(frozen=True)
class OpenRecovery:
    """A decision whose recovery is not settled: its check is in flight (`row` is the pending row),
    or its verdict asked for a revert that has not finished (`row` is the verdict)."""

    decision: Decision
    row: dict[str, Any]


class JournalError(Exception):
    """The journal could not be written; callers must not acknowledge what they could not record."""


class JournalValueError(JournalError):
    """A value cannot be stored (text with a lone surrogate): the same value will fail again."""


class JournalFenced(JournalError):
    """A write of the acting path from a replica whose term another replica has since taken (it
    lost the Lease, maybe without noticing yet): refused, so two replicas never act on one signal."""


@dataclass(frozen=True)
class Term:
    """The fencing token of the replica that acts: handed out by the journal on each takeover."""

    term: int
    holder: str
    since: float
    lease_transitions: int | None = None


class JournalBackpressure(JournalError):
    """Too many signals are pending: the caller should come back later (HTTP 503 + Retry-After)
    instead of the backlog growing without bound."""


@dataclass(frozen=True)
class SignalBatch:
    """One caller's signals for a group commit, with their rows (checked, serialized by the caller:
    the writer's turn stays short); `on_commit` runs once they are committed."""

    signals: list[Signal]
    rows: list[tuple[Any, ...]]
    on_commit: OnCommit | None = None


class GroupCommit(Generic[B, R]):
    """Group commit: one writer thread takes every batch waiting and hands them all to `write`
    (one transaction, one fsync), then completes each caller's future with its own result.

    `write` returns one result per batch, in order, an exception for a caller that failed alone;
    if it raises, every caller of the group gets that exception. Nothing completes before `write`
    has returned, so no caller hears back before its rows are committed. The storage backend
    supplies `write`; the batching is the same for any backend (SQLite here, PostgreSQL likewise).
    """

    def __init__(self, write: Callable[[list[B]], Sequence[R | Exception]], name: str,
                 max_group: int = 512) -> None:
        self._write = write
        self._name = name
        self._max_group = max_group
        self._cond = threading.Condition()
        self._waiting: list[tuple[B, Future[R]]] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, batch: B) -> Future[R]:
        fut: Future[R] = Future()
        with self._cond:
            if self._closed:
                fut.set_exception(JournalError("journal closed"))
                return fut
            self._waiting.append((batch, fut))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return fut

    def close(self) -> None:
        """Write what is waiting, then stop the writer; later submits fail with JournalError."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                taken = self._waiting[:self._max_group]
                del self._waiting[:self._max_group]
            # A caller cancelled before its turn is not written at all.
            group = [(batch, fut) for batch, fut in taken if fut.set_running_or_notify_cancel()]
            if not group:
                continue
            try:
                results = self._write([batch for batch, _ in group])
            except BaseException as exc:  # handed to every caller of the group
                results = [exc if isinstance(exc, Exception) else JournalError(f"journal writer: {exc!r}")] * len(group)
            for (_, fut), result in zip(group, results):
                if isinstance(result, Exception):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)


class Journal:
    """Thread-safe journal on SQLite or PostgreSQL; the async methods run the blocking calls in a
    worker thread.

    Args:
        store: A SQLite file (or ":memory:"), a postgres:// or postgresql:// URI, or a backend.
        max_pending: Bound on pending signals; past it, recording signals raises
            JournalBackpressure instead of growing the backlog.
    """

    def __init__(self, store: Path | str | Backend, busy_timeout_seconds: float = 5.0,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.max_pending = max_pending
        self.commits = 0  # committed write transactions (tests and benchmarks count them)
        # Names this process's notices on a shared journal, so that its own are not news to it.
        self.instance = uuid.uuid4().hex
        self._lock = threading.Lock()
        try:
            self._db: Backend = connect(store, busy_timeout_seconds)
        except Exception as exc:  # unreachable database, bad DSN, unwritable folder: not a crash
            raise JournalError(f"cannot open the journal: {type(exc).__name__}: {exc}") from exc
        # The SQLite file, None on PostgreSQL.
        self.path: Path | None = Path(store) if isinstance(store, (str, Path)) and not is_postgres(store) else None
        try:
            self._db.migrate()
            # Kept exact by every write that changes a signal's state (all of them go through here).
            self._pending = int(self._db.query("SELECT COUNT(*) AS n FROM signals WHERE state='pending'")[0]["n"])
        except BaseException as exc:
            self._db.close()
            if isinstance(exc, Exception) and not isinstance(exc, JournalError):
                raise JournalError(f"journal {self._db.describe()}: {type(exc).__name__}: {exc}") from exc
            raise
        self._group: GroupCommit[SignalBatch, Recorded] = GroupCommit(self.record_signal_batches, "journal-writer")
        # This process's term once it took one (take_term); every fenced write checks it is still
        # the journal's. Kept after leadership is lost: an in-flight write must still be checked.
        self._fence: Term | None = None

    @property
    def backend(self) -> str:
        """sqlite | postgres"""
        return self._db.name

    @property
    def shared(self) -> bool:
        """Whether several replicas may write this journal at once (PostgreSQL): each accepts
        webhooks into it, and the one that acts must look for signals the others journaled."""
        return self._db.name == "postgres"

    def describe(self) -> str:
        """Where the journal lives (a file, or the DSN without its password)."""
        return self._db.describe()

    def close(self) -> None:
        self._group.close()
        with self._lock:
            self._db.close()

    def _tx(self, fn: Callable[[], T], after_commit: Callable[[T], None] | None = None, *,
            fenced: bool = False) -> T:
        """Run `fn` in one transaction. Whatever it raises rolls the transaction back: an Exception
        comes out as JournalError (JournalValueError for text the database cannot store), anything
        else (cancellation, KeyboardInterrupt) unchanged. `after_commit` runs with the result once
        committed, still under the lock. `fenced`: a write of the acting path, refused
        (JournalFenced) when this process holds a term and another has taken a newer one."""
        with self._lock:
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
                    raise
                raise _journal_error(exc) from exc
            self.commits += 1
            if after_commit is not None:
                after_commit(result)
            return result

    def _rollback(self) -> None:
        self._db.rollback()  # never raises: the next _tx rolls back again before it begins

    # ---- leadership terms (fencing) ---------------------------------------------------------

    def take_term(self, holder: str, lease_transitions: int | None = None) -> Term:
        """Take the next term for `holder` (the replica that just acquired the Lease): from now on
        fenced writes of any process holding an older term are refused. Returns the new term."""
        _checked(holder=holder)
        now = time.time()

        def run() -> Term:
            row = self._db.execute(
                "INSERT INTO leadership(id, term, holder, lease_transitions, since) VALUES (1, 1, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET term=leadership.term + 1, holder=excluded.holder,"
                " lease_transitions=excluded.lease_transitions, since=excluded.since RETURNING term",
                (holder, lease_transitions, now)).fetchone()
            return Term(int(row["term"]), holder, now, lease_transitions)

        def held(term: Term) -> None:
            self._fence = term

        return self._tx(run, after_commit=held)

    @property
    def fence(self) -> Term | None:
        """The term this process took last (None: it never acted under leader election)."""
        return self._fence

    def current_term(self) -> Term | None:
        """The journal's term now: the replica that took over last."""
        rows = self._read("SELECT term, holder, since, lease_transitions FROM leadership WHERE id=1")
        if not rows:
            return None
        r = rows[0]
        transitions = r["lease_transitions"]
        return Term(int(r["term"]), str(r["holder"]), float(r["since"]),
                    None if transitions is None else int(transitions))

    def _check_fence(self) -> None:
        fence = self._fence
        if fence is None:
            return
        row = self._db.execute("SELECT term, holder FROM leadership WHERE id=1" + self._db.share_lock).fetchone()
        if row is None or int(row["term"]) != fence.term:
            now = "none" if row is None else f"{row['term']} ({row['holder']})"
            raise JournalFenced(f"term {fence.term} of {fence.holder} was replaced by term {now}: "
                                "this replica no longer acts; write refused")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        if self._db.concurrent_reads:
            try:
                return self._db.query(sql, params)
            except Exception as exc:
                raise JournalError(f"journal read failed: {type(exc).__name__}: {exc}") from exc
        with self._lock:
            try:
                return self._db.query(sql, params)
            except Exception as exc:
                raise JournalError(f"journal read failed: {type(exc).__name__}: {exc}") from exc

    # ---- signals ----------------------------------------------------------------------------

    def record_signals(self, signals: Iterable[Signal]) -> Recorded:
        """Insert signals in one transaction. Returns ((id, signal) of new ones, number of duplicates).

        Raises:
            JournalValueError: a text value cannot be stored; nothing was written.
            JournalBackpressure: more than `max_pending` signals are pending; nothing was written.
            JournalError: the journal could not be written.
        """
        (result,) = self.record_signal_batches([self._batch(signals)])
        if isinstance(result, JournalError):
            raise result
        return result

    def submit_signals(self, signals: Iterable[Signal], on_commit: OnCommit | None = None) -> Future[Recorded]:
        """record_signals through the group commit: concurrent callers share one transaction.
        The future completes once the signals are committed; `on_commit` runs just before."""
        try:
            batch = self._batch(signals, on_commit)
        except JournalValueError as exc:
            failed: Future[Recorded] = Future()
            failed.set_exception(exc)
            return failed
        return self._group.submit(batch)

    @staticmethod
    def _batch(signals: Iterable[Signal], on_commit: OnCommit | None = None) -> SignalBatch:
        """The batch of `signals`, every text checked (JournalValueError before anything is written)."""
        sigs, now = list(signals), time.time()
        return SignalBatch(sigs, [_signal_row(n, s, now) for n, s in enumerate(sigs)], on_commit)

    def record_signal_batches(self, batches: Sequence[SignalBatch]) -> list[Recorded | JournalError]:
        """Several callers' signals in one transaction (one fsync). Each caller's signals are
        written all or none and get the result record_signals would give it, duplicates across
        callers included (the earlier batch inserts, the later one counts a duplicate). Raises
        JournalError when the transaction itself fails (then every caller failed)."""
        results: list[Recorded | JournalError] = [([], 0) for _ in batches]

        def run() -> int:
            pending = self._pending
            for i, batch in enumerate(batches):
                if not batch.rows:
                    continue
                if pending >= self.max_pending:
                    results[i] = JournalBackpressure(
                        f"{pending} signals pending (bound {self.max_pending}); retry later")
                    continue
                try:
                    new, dup = self._insert_signals(batch.signals, batch.rows)
                except Exception as exc:
                    if not self._db.in_transaction:  # SQLite gave the whole transaction up (disk full ...)
                        raise
                    results[i] = _journal_error(exc)
                else:
                    results[i] = (new, dup)
                    pending += len(new)
            if pending > self._pending:  # a replica leading a shared journal reads them now (journal_notices)
                self._db.announce(SIGNALS_CHANNEL, self.instance)
            return pending

        def committed(pending: int) -> None:
            self._pending = pending
            for batch, result in zip(batches, results):
                if batch.on_commit is not None and isinstance(result, tuple) and result[0]:
                    try:
                        batch.on_commit(result[0])
                    except Exception:  # a listener gone (its loop closed): the rows stay pending, found by
                        pass  # the next reader of the journal

        self._tx(run, after_commit=committed)
        return results

    def _insert_signals(self, signals: Sequence[Signal], rows: Sequence[tuple[Any, ...]]) -> Recorded:
        """One caller's signals, all or none: one statement per INSERT_CHUNK rows (a statement is
        atomic; several are wrapped in a savepoint). Few statements, because the writer thread
        takes the GIL back after each one, and the event loop holds it most of the time."""
        chunks = [rows[i:i + INSERT_CHUNK] for i in range(0, len(rows), INSERT_CHUNK)]
        # On PostgreSQL any failed statement spoils the transaction: the savepoint lets this
        # caller fail alone there too.
        savepoint = len(chunks) > 1 or self._db.errors_abort_transaction
        if savepoint:
            self._db.execute("SAVEPOINT batch")
        try:
            inserted: dict[str, int] = {}
            for chunk in chunks:
                cur = self._db.execute(
                    "INSERT INTO signals(dedup_key, source, name, policy, received_at, payload) VALUES "
                    + ",".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk)) + " ON CONFLICT DO NOTHING RETURNING id, dedup_key",
                    [value for row in chunk for value in row])
                inserted.update((r["dedup_key"], int(r["id"])) for r in cur.fetchall())
        except BaseException:
            if savepoint and self._db.in_transaction:
                self._db.execute("ROLLBACK TO batch")
                self._db.execute("RELEASE batch")
            raise
        if savepoint:
            self._db.execute("RELEASE batch")
        new: list[tuple[int, Signal]] = []
        for s in signals:
            # Only inserted rows come back: a key seen before (or twice in this batch) is a duplicate.
            signal_id = inserted.pop(s.dedup_key, None)
            if signal_id is not None:
                new.append((signal_id, s))
        return new, len(signals) - len(new)

    def pending_signals(self, limit: int | None = None, after_id: int = 0) -> list[StoredSignal]:
        """Pending signals in id order: all of them, or `limit` from the first id above `after_id`."""
        rows = self._read("SELECT id, dedup_key, payload, state, received_at FROM signals"
                          " WHERE state='pending' AND id > ? ORDER BY id" + ("" if limit is None else " LIMIT ?"),
                          (after_id,) if limit is None else (after_id, limit))
        return [StoredSignal(r["id"], r["dedup_key"], decode_payload(r["payload"]), r["state"], float(r["received_at"]))
                for r in rows]

    def pending_count(self) -> int:
        """How many signals are pending (what JournalBackpressure compares with `max_pending`)."""
        with self._lock:
            return self._pending

    def mark_processed(self, signal_id: int) -> None:
        self.mark_processed_many([signal_id])

    def mark_processed_many(self, signal_ids: Sequence[int]) -> int:
        """Mark signals processed in one transaction; returns how many were still pending."""
        # One statement (the ids as a JSON array), not one per id: see _insert_signals.
        ids = json.dumps([int(i) for i in signal_ids])
        return self._tx(lambda: self._db.execute(
            "UPDATE signals SET state='processed', processed_at=? WHERE state='pending'"
            f" AND id IN ({self._db.json_ids})", (time.time(), ids)).rowcount,
            after_commit=self._processed, fenced=True)

    def _processed(self, count: int) -> None:
        self._pending = max(0, self._pending - count)

    def refresh_pending(self) -> int:
        """Count the pending signals again from the database. On a journal several replicas share,
        the count kept by this process misses the others' writes (their intake, the leader's marks):
        the service refreshes it periodically, so backpressure follows the shared backlog."""
        count = int(self._read("SELECT COUNT(*) AS n FROM signals WHERE state='pending'")[0]["n"])
        with self._lock:
            self._pending = count
        return count

    @property
    def dsn(self) -> str | None:
        """The PostgreSQL connection string (journal_notices listens there); None on SQLite."""
        dsn = getattr(self._db, "dsn", None)
        return dsn if self._db.name == "postgres" and isinstance(dsn, str) else None

    def signals(self) -> list[dict[str, Any]]:
        rows = self._read("SELECT * FROM signals ORDER BY id")
        return [dict(r) | {"payload": decode_payload(r["payload"])} for r in rows]

    def signals_since(self, since: float) -> list[StoredSignal]:
        """Every signal journaled after `since`, pending or processed, in id order (common cause)."""
        rows = self._read("SELECT id, dedup_key, payload, state, received_at FROM signals"
                          " WHERE received_at > ? ORDER BY id", (since,))
        return [StoredSignal(r["id"], r["dedup_key"], decode_payload(r["payload"]), r["state"], float(r["received_at"]))
                for r in rows]

    # ---- decisions and steps ----------------------------------------------------------------

    def decision(self, decision_id: int) -> Decision | None:
        rows = self._read("SELECT * FROM decisions WHERE id=?", (decision_id,))
        return _decision(rows[0]) if rows else None

    def decision_for(self, signal_id: int, policy: str) -> Decision | None:
        rows = self._read("SELECT * FROM decisions WHERE signal_id=? AND policy=?", (signal_id, policy))
        return _decision(rows[0]) if rows else None

    def record_decision(self, signal_id: int, policy: str, target: str, state: DecisionState, reason: str,
                        plan: dict[str, Any], executed: bool) -> int:
        _checked(policy=policy, target=target, state=state, reason=reason)

        def run() -> int:
            # The claim: which replica, in which term, decided (a new leader resuming it claims it anew).
            fence = self._fence
            holder, term = (None, None) if fence is None else (fence.holder, fence.term)
            row = self._db.execute(
                "INSERT INTO decisions(signal_id, policy, target, at, state, reason, plan, executed, holder, term)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(signal_id, policy) DO UPDATE SET state=excluded.state,"
                " reason=excluded.reason, plan=excluded.plan, executed=CASE WHEN excluded.executed > decisions.executed"
                " THEN excluded.executed ELSE decisions.executed END, holder=excluded.holder, term=excluded.term"
                " RETURNING id",
                (signal_id, policy, target, time.time(), state, reason, json.dumps(plan), int(executed), holder, term),
            ).fetchone()
            return int(row["id"])

        return self._tx(run, fenced=True)

    def finish_decision(self, decision_id: int, state: DecisionState, reason: str,
                        recovery: tuple[str, dict[str, Any]] | None = None) -> None:
        """Set the decision's final state; with `recovery` (message, data), its recovery check is
        journaled as in flight (a pending recovery row) in the same transaction."""
        _checked(state=state, reason=reason)

        def run() -> None:
            self._db.execute("UPDATE decisions SET state=?, reason=? WHERE id=?", (state, reason, decision_id))
            if recovery is not None:
                self._insert_step(decision_id, -1, RECOVERY, RECOVERY, "pending", recovery[0], recovery[1], None)

        self._tx(run, fenced=True)

    def record_step(self, decision_id: int, idx: int, action: str, phase: str, status: str,
                    message: str, data: dict[str, Any], duration_seconds: float | None) -> None:
        self._tx(lambda: self._insert_step(decision_id, idx, action, phase, status, message, data, duration_seconds),
                 fenced=True)

    def _insert_step(self, decision_id: int, idx: int, action: str, phase: str, status: str,
                     message: str, data: dict[str, Any], duration_seconds: float | None) -> None:
        _checked(action=action, phase=phase, status=status, message=message)
        self._db.execute(
            "INSERT INTO steps(decision_id, idx, action, phase, status, message, data, at, duration_seconds)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (decision_id, idx, action, phase, status, message, json.dumps(data, default=str),
             time.time(), duration_seconds))

    def record_verdict(self, decision_id: int, status: str, message: str, data: dict[str, Any],
                       freeze: tuple[str, str, float] | None = None) -> int | None:
        """The recovery verdict (a recovery row with `status`), and with `freeze` (target, reason,
        until) the target's freeze that escalates it, in one transaction. Returns the freeze's id."""
        if freeze is not None:
            _checked(target=freeze[0], reason=freeze[1])

        def run() -> int | None:
            self._insert_step(decision_id, -1, RECOVERY, RECOVERY, status, message, data, None)
            if freeze is None:
                return None
            return self._insert_freeze(freeze[0], freeze[1], freeze[2], decision_id)

        return self._tx(run, fenced=True)

    def open_recoveries(self) -> list[OpenRecovery]:
        """Decisions whose recovery is unsettled (what a restart resumes), oldest first: the last
        recovery row is pending, or it is a verdict whose follow-up revert has not finished the
        decision (still `succeeded`)."""
        rows = self._read(
            "SELECT d.*, s.id AS row_id, s.status AS row_status, s.message AS row_message, s.data AS row_data,"
            " s.at AS row_at FROM decisions d JOIN steps s ON s.decision_id = d.id"
            " WHERE s.phase = ? AND s.id = (SELECT MAX(id) FROM steps WHERE decision_id = d.id AND phase = ?)"
            " AND (s.status = 'pending' OR (d.state = ? AND " + self._db.json_text("s.data", "follow_up") + " = 'revert'"
            " AND s.status IN ('not_recovered', 'unknown'))) ORDER BY d.id",
            (RECOVERY, RECOVERY, DecisionState.SUCCEEDED.value))
        return [OpenRecovery(_decision(r), {"id": r["row_id"], "status": r["row_status"],
                                            "message": r["row_message"], "data": json.loads(r["row_data"]),
                                            "at": r["row_at"]}) for r in rows]

    # ---- target freezes ---------------------------------------------------------------------

    def _insert_freeze(self, target: str, reason: str, until: float, decision_id: int | None,
                       by: str | None = None, source: str | None = None) -> int:
        row = self._db.execute('INSERT INTO freezes(target, reason, at, until, decision_id, "by", source)'
                               " VALUES (?,?,?,?,?,?,?) RETURNING id",
                               (target, reason, time.time(), until, decision_id, by, source)).fetchone()
        return int(row["id"])

    def record_freeze(self, target: str, reason: str, until: float, decision_id: int | None = None, *,
                      by: str | None = None, source: str | None = None) -> int:
        """Freeze `target` (DAEMON_SCOPE: every target) until `until` (unix seconds; FOREVER: until
        lifted): no policy acts on it meanwhile. `by` and `source` say who and how."""
        _checked(target=target, reason=reason, by=by, source=source)
        return self._tx(lambda: self._insert_freeze(target, reason, until, decision_id, by, source))

    def active_freezes(self, now: float | None = None) -> list[Freeze]:
        """Every freeze in force at `now` (not lifted, not expired), oldest first."""
        now = time.time() if now is None else now
        return [_freeze(r) for r in self._read("SELECT * FROM freezes WHERE lifted_at IS NULL AND until > ?"
                                               " ORDER BY at, id", (now,))]

    def active_freeze(self, target: str, now: float | None = None) -> Freeze | None:
        """The freeze on `target` that lasts longest, if one is in force at `now` (not lifted, not expired)."""
        now = time.time() if now is None else now
        rows = self._read("SELECT * FROM freezes WHERE target=? AND lifted_at IS NULL AND until > ?"
                          " ORDER BY until DESC LIMIT 1", (target, now))
        return _freeze(rows[0]) if rows else None

    def lift_freezes(self, target: str, reason: str, now: float | None = None, *, by: str | None = None,
                     ids: Sequence[int] | None = None) -> list[Freeze]:
        """Lift the freezes in force on `target` (`tailguard unfreeze`), only those with `ids` when
        given; the ones lifted."""
        _checked(target=target, reason=reason, by=by)
        at = time.time() if now is None else now
        only = "" if ids is None else f" AND id IN ({self._db.json_ids})"
        extra = () if ids is None else (json.dumps([int(i) for i in ids]),)

        def run() -> list[Freeze]:
            rows = self._db.execute(
                "UPDATE freezes SET lifted_at=?, lifted_reason=?, lifted_by=? WHERE target=? AND lifted_at IS NULL"
                f" AND until > ?{only} RETURNING *", (at, reason, by, target, at, *extra)).fetchall()
            return [_freeze(r) for r in rows]

        return self._tx(run)

    def freezes(self, target: str | None = None) -> list[Freeze]:
        """Every freeze journaled (in force, expired or lifted), oldest first."""
        if target is None:
            return [_freeze(r) for r in self._read("SELECT * FROM freezes ORDER BY id")]
        return [_freeze(r) for r in self._read("SELECT * FROM freezes WHERE target=? ORDER BY id", (target,))]

    def decisions(self, policy: str | None = None) -> list[Decision]:
        if policy is None:
            rows = self._read("SELECT * FROM decisions ORDER BY id")
        else:
            rows = self._read("SELECT * FROM decisions WHERE policy=? ORDER BY id", (policy,))
        return [_decision(r) for r in rows]

    def steps(self, decision_id: int) -> list[dict[str, Any]]:
        rows = self._read("SELECT * FROM steps WHERE decision_id=? ORDER BY id", (decision_id,))
        return [dict(r) | {"data": json.loads(r["data"])} for r in rows]

    def guard_history(self, policy: str, target: str, window_seconds: float,
                      now: float | None = None) -> tuple[float | None, int]:
        """(time of the last executed plan, executed plans within the window)."""
        now = time.time() if now is None else now
        # UNION (not UNION ALL): a mark this journal exported and imported back is one plan.
        rows = self._read(
            "SELECT MAX(at) AS last, SUM(CASE WHEN at > ? THEN 1 ELSE 0 END) AS n FROM ("
            " SELECT at FROM decisions WHERE policy=? AND target=? AND executed=1"
            " UNION SELECT at FROM guard_marks WHERE policy=? AND target=?) AS plans",
            (now - window_seconds, policy, target, policy, target),
        )
        last = rows[0]["last"]
        return (None if last is None else float(last)), int(rows[0]["n"] or 0)

    def executed_marks(self, since: float) -> list[tuple[str, str, float]]:
        """(policy, target, at) of every executed plan after `since`, local or imported."""
        rows = self._read(
            "SELECT policy, target, at FROM decisions WHERE executed=1 AND at > ?"
            " UNION SELECT policy, target, at FROM guard_marks WHERE at > ? ORDER BY policy, target, at",
            (since, since))
        return [(r["policy"], r["target"], float(r["at"])) for r in rows]

    def prune(self, before: float) -> dict[str, int]:
        """Delete what is older than `before`: decisions (with their steps), processed signals left
        without decisions, stale evaluations. Pending signals and pins are never pruned; the
        retention must exceed every guard window (config enforces at least a day)."""

        def run() -> dict[str, int]:
            old = "SELECT id FROM decisions WHERE at < ?"
            steps = self._db.execute(f"DELETE FROM steps WHERE decision_id IN ({old})", (before,)).rowcount
            self._db.execute(f"DELETE FROM approvals WHERE decision_id IN ({old})", (before,))
            decisions = self._db.execute("DELETE FROM decisions WHERE at < ?", (before,)).rowcount
            signals = self._db.execute(
                "DELETE FROM signals WHERE state='processed' AND received_at < ?"
                " AND id NOT IN (SELECT signal_id FROM decisions)", (before,)).rowcount
            evaluations = self._db.execute("DELETE FROM evaluations WHERE at < ?", (before,)).rowcount
            self._db.execute("DELETE FROM freezes WHERE until < ?", (before,))  # over long ago
            return {"signals": signals, "decisions": decisions, "steps": steps, "evaluations": evaluations}

        return self._tx(run)

    def latest_decisions(self) -> list[dict[str, Any]]:
        """The latest decision of every (policy, target), with the signal it answered (operator status)."""
        rows = self._read(
            "SELECT d.id, d.policy, d.target, d.at, d.state, d.reason, s.name AS signal_name,"
            " s.source AS signal_source, s.received_at AS signal_at FROM decisions d"
            " JOIN signals s ON s.id = d.signal_id"
            " WHERE d.id IN (SELECT MAX(id) FROM decisions GROUP BY policy, target) ORDER BY d.target, d.policy")
        return [dict(r) for r in rows]

    def signal(self, signal_id: int) -> StoredSignal | None:
        rows = self._read("SELECT id, dedup_key, payload, state, received_at FROM signals WHERE id=?", (signal_id,))
        return (StoredSignal(rows[0]["id"], rows[0]["dedup_key"], json.loads(rows[0]["payload"]), rows[0]["state"],
                             float(rows[0]["received_at"])) if rows else None)

    # ---- approvals ----------------------------------------------------------------------------

    def request_approval(self, signal_id: int, policy: str, target: str, plan: dict[str, Any],
                         deadline: float) -> Approval:
        """Journal a plan that waits for an operator: its decision (blocked, "awaiting approval N")
        and the approval, in one transaction. An approved plan's decision turns `executing` (approve)."""
        _checked(policy=policy, target=target)

        def run() -> Approval:
            now = time.time()
            self._db.execute(
                "INSERT INTO decisions(signal_id, policy, target, at, state, reason, plan, executed)"
                " VALUES (?, ?, ?, ?, ?, '', ?, 0)",
                (signal_id, policy, target, now, DecisionState.BLOCKED.value, json.dumps(plan)))
            decision_id = int(self._db.execute("SELECT id FROM decisions WHERE signal_id=? AND policy=?",
                                               (signal_id, policy)).fetchone()["id"])
            approval_id = int(self._db.execute(
                "INSERT INTO approvals(decision_id, policy, target, requested_at, deadline)"
                " VALUES (?,?,?,?,?) RETURNING id", (decision_id, policy, target, now, deadline)).fetchone()["id"])
            self._db.execute("UPDATE decisions SET reason=? WHERE id=?",
                             (f"awaiting approval {approval_id} until {_iso(deadline)}", decision_id))
            return Approval(approval_id, decision_id, policy, target, now, deadline, "pending")

        return self._tx(run, fenced=True)

    def approval(self, approval_id: int) -> Approval | None:
        rows = self._read("SELECT * FROM approvals WHERE id=?", (approval_id,))
        return _approval(rows[0]) if rows else None

    def approvals(self, status: str | None = None) -> list[Approval]:
        """Approvals (of one status when given), oldest first."""
        if status is None:
            return [_approval(r) for r in self._read("SELECT * FROM approvals ORDER BY id")]
        return [_approval(r) for r in self._read("SELECT * FROM approvals WHERE status=? ORDER BY id", (status,))]

    def pending_approval(self, policy: str, target: str) -> Approval | None:
        rows = self._read("SELECT * FROM approvals WHERE status='pending' AND policy=? AND target=?"
                          " ORDER BY id LIMIT 1", (policy, target))
        return _approval(rows[0]) if rows else None

    def approve(self, approval_id: int, by: str, reason: str, now: float | None = None) -> Approval | None:
        """Approve a pending approval before its deadline: its decision turns `executing`, executed
        (it counts for cooldown and rate limit from now). None when it is not pending (or past its deadline)."""
        _checked(by=by, reason=reason)
        at = time.time() if now is None else now

        def run() -> Approval | None:
            row = self._db.execute(
                "UPDATE approvals SET status='approved', decided_at=?, decided_by=?, reason=? WHERE id=?"
                " AND status='pending' AND deadline > ? RETURNING *", (at, by, reason, approval_id, at)).fetchone()
            if row is None:
                return None
            approval = _approval(row)
            self._db.execute("UPDATE decisions SET state=?, executed=1, at=?, reason=? WHERE id=?",
                             (DecisionState.EXECUTING.value, at, f"approved by {by}: {reason}; applying",
                              approval.decision_id))
            return approval

        return self._tx(run)

    def expire_approvals(self, now: float | None = None) -> list[Approval]:
        """Expire the pending approvals whose deadline has passed; their decisions say so. The ones expired."""
        at = time.time() if now is None else now

        def run() -> list[Approval]:
            rows = self._db.execute(
                "UPDATE approvals SET status='expired', decided_at=?, reason='deadline passed' WHERE status='pending'"
                " AND deadline <= ? RETURNING *", (at, at)).fetchall()
            expired = [_approval(r) for r in rows]
            for a in expired:
                self._db.execute("UPDATE decisions SET reason=? WHERE id=?",
                                 (f"approval {a.id} expired at {_iso(a.deadline)}; not applied", a.decision_id))
            return expired

        return self._tx(run, fenced=True)

    # ---- detector evaluations and pins -------------------------------------------------------

    def record_evaluation(self, policy: str, trigger_index: int, series: str, fired: bool,
                          reason: str) -> None:
        """The latest verdict per series (no signal is also an answer, with its reason)."""
        _checked(policy=policy, series=series, reason=reason)
        self._tx(lambda: self._db.execute(
            "INSERT INTO evaluations(policy, trigger_index, series, at, fired, reason) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(policy, trigger_index, series) DO UPDATE SET at=excluded.at,"
            " fired=excluded.fired, reason=excluded.reason",
            (policy, trigger_index, series, time.time(), int(fired), reason)))

    def record_evaluations(self, rows: Sequence[tuple[str, int, str, bool, str]]) -> None:
        """Many verdicts (policy, trigger index, series, fired, reason) in one transaction:
        a poll cycle over thousands of series must not pay one fsync per series."""
        for p, _, k, _, r in rows:
            # ASCII text is always storable: _checked (which names the field) only where some is not.
            if not (isinstance(p, str) and isinstance(k, str) and isinstance(r, str)
                    and p.isascii() and k.isascii() and r.isascii()):
                _checked(policy=p, series=k, reason=r)
        now = time.time()
        self._tx(lambda: self._db.executemany(
            "INSERT INTO evaluations(policy, trigger_index, series, at, fired, reason) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(policy, trigger_index, series) DO UPDATE SET at=excluded.at,"
            " fired=excluded.fired, reason=excluded.reason",
            [(p, i, k, now, int(f), r) for p, i, k, f, r in rows]))

    def evaluations(self, policy: str | None = None) -> list[dict[str, Any]]:
        if policy is None:
            return [dict(r) for r in self._read("SELECT * FROM evaluations ORDER BY policy, series")]
        return [dict(r) for r in self._read("SELECT * FROM evaluations WHERE policy=? ORDER BY series",
                                            (policy,))]

    def record_pin(self, target: str, model: str, version: int, *, from_version: int | None = None,
                   decision_id: int | None = None, reason: str = "", policy: str | None = None) -> None:
        """Remember that `target` must serve only `version` (re-applied to new replicas).

        `from_version` (the version rolled back from) is marked bad for `target` when it is newer
        than `version`, with `reason` and `decision_id`; the signal's name is taken from the decision.
        """
        _checked(target=target, model=model, reason=reason, policy=policy)

        def run() -> None:
            signal = None
            if decision_id is not None:
                row = self._db.execute("SELECT s.name FROM decisions d JOIN signals s ON s.id=d.signal_id"
                                       " WHERE d.id=?", (decision_id,)).fetchone()
                signal = row["name"] if row is not None else None
            now = time.time()
            self._db.execute(
                "INSERT INTO pins(target, model, version, at, from_version, decision_id, signal, reason, policy)"
                " VALUES (?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT(target) DO UPDATE SET model=excluded.model, version=excluded.version,"
                " at=excluded.at, from_version=COALESCE(excluded.from_version, pins.from_version),"
                " decision_id=COALESCE(excluded.decision_id, pins.decision_id),"
                " signal=COALESCE(excluded.signal, pins.signal), reason=excluded.reason,"
                " policy=COALESCE(excluded.policy, pins.policy)",
                (target, model, version, now, from_version, decision_id, signal, reason, policy))
            if from_version is not None and from_version > version:
                self._mark_bad(target, from_version,
                               f"rolled back to {version}" + (f" by decision {decision_id}" if decision_id else "")
                               + (f" ({signal})" if signal else "") + (f": {reason}" if reason else ""),
                               decision_id, now)

        self._tx(run, fenced=True)

    def end_pin(self, target: str, reason: str, *, unmark_decision: bool = False) -> dict[str, Any] | None:
        """End the live pin of `target`: moved to pin_history with `reason`. Returns the ended pin,
        or None when there was none. `unmark_decision`: also clear the bad-version marks the pin's
        decision made (its rollback was reverted)."""
        _checked(target=target, reason=reason)

        def run() -> dict[str, Any] | None:
            row = self._db.execute("SELECT * FROM pins WHERE target=?", (target,)).fetchone()
            if row is None:
                return None
            pin, now = dict(row), time.time()
            self._db.execute(
                "INSERT INTO pin_history(target, model, version, at, from_version, decision_id, signal, reason,"
                " policy, ended_at, ended_reason) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (pin["target"], pin["model"], pin["version"], pin["at"], pin["from_version"], pin["decision_id"],
                 pin["signal"], pin["reason"] or "", pin["policy"], now, reason))
            self._db.execute("DELETE FROM pins WHERE target=?", (target,))
            if unmark_decision and pin["decision_id"] is not None:
                self._db.execute("UPDATE bad_versions SET cleared_at=?, cleared_reason=? WHERE target=?"
                                 " AND decision_id=? AND cleared_at IS NULL",
                                 (now, f"pin ended: {reason}", target, pin["decision_id"]))
            return {**pin, "ended_at": now, "ended_reason": reason}

        return self._tx(run)

    def clear_pin(self, target: str, reason: str = "cleared") -> None:
        """End the pin of `target` (a reverted rollback): its decision's bad-version marks are cleared."""
        self.end_pin(target, reason, unmark_decision=True)

    def pins(self) -> list[dict[str, Any]]:
        """The live pins."""
        return [dict(r) for r in self._read("SELECT * FROM pins")]

    def ended_pins(self, target: str | None = None) -> list[dict[str, Any]]:
        """Pins that ended, oldest first."""
        if target is None:
            return [dict(r) for r in self._read("SELECT * FROM pin_history ORDER BY id")]
        return [dict(r) for r in self._read("SELECT * FROM pin_history WHERE target=? ORDER BY id", (target,))]

    def _mark_bad(self, target: str, version: int, reason: str, decision_id: int | None, now: float) -> None:
        if self._db.execute("SELECT 1 FROM bad_versions WHERE target=? AND version=? AND cleared_at IS NULL",
                            (target, version)).fetchone() is None:
            self._db.execute("INSERT INTO bad_versions(target, version, reason, decision_id, at)"
                             " VALUES (?,?,?,?,?)", (target, version, reason, decision_id, now))

    def mark_bad(self, target: str, version: int, reason: str, decision_id: int | None = None) -> None:
        """Mark `version` bad for `target` (kept once while not cleared)."""
        _checked(target=target, reason=reason)
        self._tx(lambda: self._mark_bad(target, int(version), reason, decision_id, time.time()), fenced=True)

    def bad_versions(self, target: str, include_cleared: bool = False) -> list[dict[str, Any]]:
        """The bad-version marks of `target` (only those in force unless `include_cleared`), oldest first."""
        where = "" if include_cleared else " AND cleared_at IS NULL"
        return [dict(r) for r in self._read(f"SELECT * FROM bad_versions WHERE target=?{where} ORDER BY id",
                                            (target,))]

    def known_bad(self, target: str) -> frozenset[int]:
        """The versions of `target` marked bad and not cleared."""
        return frozenset(int(r["version"]) for r in self._read(
            "SELECT version FROM bad_versions WHERE target=? AND cleared_at IS NULL", (target,)))

    def clear_bad(self, target: str, version: int, reason: str) -> int:
        """Clear the mark on `version` of `target` (journaled with `reason`); how many were cleared."""
        _checked(target=target, reason=reason)
        return self._tx(lambda: self._db.execute(
            "UPDATE bad_versions SET cleared_at=?, cleared_reason=? WHERE target=? AND version=?"
            " AND cleared_at IS NULL", (time.time(), reason, target, int(version))).rowcount)

    def shared_state(self, since: float, now: float | None = None) -> SharedState:
        """What the cluster state shares besides live pins and guard marks: the newest pin end per
        target, bad-version marks in force and their clears, freezes in force and their lifts.
        Ends, clears and lifts are kept when they happened after `since` (a lift also while a freeze
        it lifted would still be in force at `now`)."""
        now = time.time() if now is None else now
        ends: dict[str, tuple[str, float, float, str]] = {}
        for r in self._read("SELECT target, at, ended_at, ended_reason FROM pin_history WHERE ended_at > ?"
                            " ORDER BY target, at, ended_at", (since,)):
            ends[r["target"]] = (r["target"], float(r["at"]), float(r["ended_at"]), r["ended_reason"])
        marks: dict[tuple[str, int], tuple[str, int, str, float]] = {}
        for r in self._read("SELECT target, version, reason, at FROM bad_versions WHERE cleared_at IS NULL"
                            " ORDER BY at, id"):
            marks[(r["target"], int(r["version"]))] = (r["target"], int(r["version"]), r["reason"], float(r["at"]))
        clears: dict[tuple[str, int], tuple[str, int, float, str]] = {}
        for r in self._read("SELECT target, version, cleared_at, cleared_reason FROM bad_versions"
                            " WHERE cleared_at > ? ORDER BY cleared_at, id", (since,)):
            clears[(r["target"], int(r["version"]))] = (r["target"], int(r["version"]), float(r["cleared_at"]),
                                                         r["cleared_reason"] or "")
        freezes = tuple((r["target"], r["reason"], float(r["at"]), float(r["until"])) for r in self._read(
            "SELECT target, reason, at, until FROM freezes WHERE lifted_at IS NULL AND until > ?"
            " ORDER BY target, at", (now,)))
        lifts: dict[str, tuple[str, float, str, float]] = {}
        for r in self._read("SELECT target, lifted_at, lifted_reason, until FROM freezes WHERE lifted_at IS NOT NULL"
                            " ORDER BY lifted_at, id"):
            prev = lifts.get(r["target"])
            until = max(float(r["until"]), prev[3] if prev else float("-inf"))
            lifts[r["target"]] = (r["target"], float(r["lifted_at"]), r["lifted_reason"] or "", until)
        return SharedState(tuple(ends.values()), tuple(marks.values()), tuple(clears.values()), freezes,
                           tuple(lift for lift in lifts.values() if lift[1] > since or lift[3] > now))

    def merge_cluster_state(self, pins: Iterable[tuple[str, str, int, float]],
                            marks: Iterable[tuple[str, str, float]], since: float,
                            shared: SharedState | None = None, now: float | None = None) -> tuple[int, int, int]:
        """Import what another leader recorded, in one transaction. Idempotent: importing the same
        state again changes nothing.

        Args:
            pins: (target, model, version, at); the newer `at` wins over a local pin, and a known end
                (shared or in pin_history) with the same or a newer pin `at` wins over the pin.
            marks: (policy, target, at) of executed plans, counted by guard_history from now on.
            since: imported marks at or before this are dropped (they can no longer block anything).
            shared: pin ends (a live local pin they cover moves to pin_history), bad-version marks
                and clears (a clear covers the marks of its version made at or before it), freezes
                and lifts (a lift covers the target's freezes made at or before it); see SharedState.
            now: freezes that ended by then are not imported.

        Returns:
            (pins inserted, replaced or ended; marks added; bad-version, freeze rows added or updated).
        """
        pin_rows, mark_rows = list(pins), list(marks)
        extra = shared or SharedState()
        now = time.time() if now is None else now
        for target, model, _, _ in pin_rows:
            _checked(target=target, model=model)
        for policy, target, _ in mark_rows:
            _checked(policy=policy, target=target)
        for target, _, _, reason in extra.pin_ends:
            _checked(target=target, reason=reason)
        for target, _, reason, _ in extra.bad_marks:
            _checked(target=target, reason=reason)
        for target, _, _, reason in extra.bad_clears:
            _checked(target=target, reason=reason)
        for target, reason, _, _ in extra.freezes:
            _checked(target=target, reason=reason)
        for target, _, reason, _ in extra.lifts:
            _checked(target=target, reason=reason)
        ended_at: dict[str, float] = {}
        for target, pin_at, _, _ in extra.pin_ends:
            ended_at[target] = max(float(pin_at), ended_at.get(target, float("-inf")))
        cleared_at: dict[tuple[str, int], float] = {}
        for target, version, at, _ in extra.bad_clears:
            key = (target, int(version))
            cleared_at[key] = max(float(at), cleared_at.get(key, float("-inf")))
        lifted_at: dict[str, float] = {}
        for target, at, _, _ in extra.lifts:
            lifted_at[target] = max(float(at), lifted_at.get(target, float("-inf")))

        def run() -> tuple[int, int, int]:
            changed = added = other = 0
            for target, pin_at, end_at, reason in extra.pin_ends:
                row = self._db.execute("SELECT * FROM pins WHERE target=? AND at<=?", (target, float(pin_at))).fetchone()
                if row is not None:
                    pin = dict(row)
                    self._db.execute(
                        "INSERT INTO pin_history(target, model, version, at, from_version, decision_id, signal,"
                        " reason, policy, ended_at, ended_reason) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (pin["target"], pin["model"], pin["version"], pin["at"], pin["from_version"],
                         pin["decision_id"], pin["signal"], pin["reason"] or "", pin["policy"], float(end_at),
                         reason))
                    changed += self._db.execute("DELETE FROM pins WHERE target=?", (target,)).rowcount
            for target, model, version, at in pin_rows:
                if float(at) <= ended_at.get(target, float("-inf")) or self._db.execute(
                        "SELECT 1 FROM pin_history WHERE target=? AND at>=?", (target, float(at))).fetchone():
                    continue  # that pin (or a newer one) is known to have ended
                changed += self._db.execute(
                    "INSERT INTO pins(target, model, version, at) VALUES (?,?,?,?)"
                    " ON CONFLICT(target) DO UPDATE SET model=excluded.model, version=excluded.version,"
                    " at=excluded.at WHERE excluded.at > pins.at",
                    (target, model, int(version), float(at))).rowcount
            for policy, target, at in mark_rows:
                if at > since:
                    added += self._db.execute(
                        "INSERT INTO guard_marks(policy, target, at) VALUES (?,?,?) ON CONFLICT DO NOTHING",
                        (policy, target, float(at))).rowcount
            self._db.execute("DELETE FROM guard_marks WHERE at <= ?", (since,))
            for target, version, at, reason in extra.bad_clears:
                other += self._db.execute(
                    "UPDATE bad_versions SET cleared_at=?, cleared_reason=? WHERE target=? AND version=?"
                    " AND cleared_at IS NULL AND at <= ?", (float(at), reason, target, int(version), float(at))).rowcount
            for target, version, reason, at in extra.bad_marks:
                if float(at) <= cleared_at.get((target, int(version)), float("-inf")):
                    continue
                if self._db.execute("SELECT 1 FROM bad_versions WHERE target=? AND version=?"
                                    " AND (cleared_at IS NULL OR cleared_at >= ?)",
                                    (target, int(version), float(at))).fetchone() is None:
                    other += self._db.execute("INSERT INTO bad_versions(target, version, reason, at) VALUES (?,?,?,?)",
                                              (target, int(version), reason, float(at))).rowcount
            for target, at, reason, _ in extra.lifts:
                other += self._db.execute(
                    "UPDATE freezes SET lifted_at=?, lifted_reason=? WHERE target=? AND lifted_at IS NULL"
                    " AND at <= ? AND until > ?", (float(at), reason, target, float(at), float(at))).rowcount
            for target, reason, at, until in extra.freezes:
                if float(until) <= now or float(at) <= lifted_at.get(target, float("-inf")):
                    continue
                if self._db.execute("SELECT 1 FROM freezes WHERE target=? AND (at=? OR lifted_at >= ?)",
                                    (target, float(at), float(at))).fetchone() is None:
                    other += self._db.execute("INSERT INTO freezes(target, reason, at, until) VALUES (?,?,?,?)",
                                              (target, reason, float(at), float(until))).rowcount
            return changed, added, other

        return self._tx(run)


def _in_thread(fn: Callable[Concatenate[Journal, P], T]) -> Callable[Concatenate["AsyncJournal", P], Awaitable[T]]:
    """`fn` of the sync journal as a coroutine that runs it in a worker thread."""

    async def call(self: "AsyncJournal", /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(fn, self.sync, *args, **kwargs)

    call.__doc__ = fn.__doc__
    return call


class AsyncJournal:
    """The journal for the event loop: each call runs in a thread so SQLite's fsync never blocks it."""

    def __init__(self, journal: Journal) -> None:
        self.sync = journal
        self._listener: tuple[asyncio.AbstractEventLoop, OnCommit] | None = None

    @property
    def shared(self) -> bool:
        return self.sync.shared

    def on_signals(self, listener: OnCommit | None) -> None:
        """Call `listener` on this event loop with the (id, signal) of the new signals of every
        record_signals call, in commit order, once committed and before that call returns; None
        stops. Scheduled while the journal is still locked after the commit, so a read of the
        journal that this loop sees complete later was made after the listener was called."""
        self._listener = None if listener is None else (asyncio.get_running_loop(), listener)

    async def record_signals(self, signals: Iterable[Signal]) -> Recorded:
        """Journal.record_signals, group-committed: concurrent callers share one transaction (one
        fsync); each gets its own result once its signals are committed."""
        on_commit: OnCommit | None = None
        if self._listener is not None:
            loop, listener = self._listener

            def on_commit(new: list[tuple[int, Signal]]) -> None:
                loop.call_soon_threadsafe(listener, new)

        return await asyncio.wrap_future(self.sync.submit_signals(signals, on_commit))

    pending_signals = _in_thread(Journal.pending_signals)
    pending_count = _in_thread(Journal.pending_count)
    mark_processed = _in_thread(Journal.mark_processed)
    mark_processed_many = _in_thread(Journal.mark_processed_many)
    signals = _in_thread(Journal.signals)
    signals_since = _in_thread(Journal.signals_since)
    decision = _in_thread(Journal.decision)
    decision_for = _in_thread(Journal.decision_for)
    record_decision = _in_thread(Journal.record_decision)
    finish_decision = _in_thread(Journal.finish_decision)
    record_step = _in_thread(Journal.record_step)
    decisions = _in_thread(Journal.decisions)
    steps = _in_thread(Journal.steps)
    record_verdict = _in_thread(Journal.record_verdict)
    open_recoveries = _in_thread(Journal.open_recoveries)
    record_freeze = _in_thread(Journal.record_freeze)
    active_freeze = _in_thread(Journal.active_freeze)
    lift_freezes = _in_thread(Journal.lift_freezes)
    freezes = _in_thread(Journal.freezes)
    active_freezes = _in_thread(Journal.active_freezes)
    latest_decisions = _in_thread(Journal.latest_decisions)
    signal = _in_thread(Journal.signal)
    request_approval = _in_thread(Journal.request_approval)
    approval = _in_thread(Journal.approval)
    approvals = _in_thread(Journal.approvals)
    pending_approval = _in_thread(Journal.pending_approval)
    approve = _in_thread(Journal.approve)
    expire_approvals = _in_thread(Journal.expire_approvals)
    guard_history = _in_thread(Journal.guard_history)
    executed_marks = _in_thread(Journal.executed_marks)
    prune = _in_thread(Journal.prune)
    record_evaluation = _in_thread(Journal.record_evaluation)
    record_evaluations = _in_thread(Journal.record_evaluations)
    evaluations = _in_thread(Journal.evaluations)
    record_pin = _in_thread(Journal.record_pin)
    clear_pin = _in_thread(Journal.clear_pin)
    end_pin = _in_thread(Journal.end_pin)
    pins = _in_thread(Journal.pins)
    ended_pins = _in_thread(Journal.ended_pins)
    mark_bad = _in_thread(Journal.mark_bad)
    bad_versions = _in_thread(Journal.bad_versions)
    known_bad = _in_thread(Journal.known_bad)
    clear_bad = _in_thread(Journal.clear_bad)
    shared_state = _in_thread(Journal.shared_state)
    merge_cluster_state = _in_thread(Journal.merge_cluster_state)
    take_term = _in_thread(Journal.take_term)
    current_term = _in_thread(Journal.current_term)
    refresh_pending = _in_thread(Journal.refresh_pending)


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


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="seconds")


def _checked(**fields: object) -> None:
    """Raise JournalValueError naming the first text field SQLite could not store: text that is
    not encodable as UTF-8 (a lone surrogate such as "\\ud800" from a JSON escape)."""
    for name, value in fields.items():
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise JournalValueError(f"{name}: not storable as UTF-8 text ({exc.reason} at position "
                                        f"{exc.start})") from exc


def _signal_row(n: int, s: Signal, now: float) -> tuple[Any, ...]:
    """The signals row of `s` (the n-th of its batch), every text checked."""
    dedup_key, source, name, policy = s.dedup_key, s.source.value, s.name, s.policy
    # ASCII text is always storable: _checked (which names the field) only where some is not.
    if not (isinstance(dedup_key, str) and isinstance(source, str) and isinstance(name, str)
            and (dedup_key + source + name).isascii() and (policy is None or isinstance(policy, str) and policy.isascii())):
        prefix = f"signal {n} "
        _checked(**{prefix + "dedup_key": dedup_key, prefix + "source": source, prefix + "name": name,
                    prefix + "policy": policy})
    # ensure_ascii (the default): the payload is always storable, escapes included.
    return (dedup_key, source, name, policy, now, s.summary_json())


def _freeze(r: Row) -> Freeze:
    return Freeze(r["id"], r["target"], r["reason"], r["at"], r["until"], r["decision_id"], r["lifted_at"],
                  r["lifted_reason"], r["by"], r["source"], r["lifted_by"])


def _approval(r: Row) -> Approval:
    return Approval(r["id"], r["decision_id"], r["policy"], r["target"], r["requested_at"], r["deadline"],
                    r["status"], r["decided_at"], r["decided_by"], r["reason"])


def _decision(r: Row) -> Decision:
    return Decision(r["id"], r["signal_id"], r["policy"], r["target"], r["at"], DecisionState(r["state"]), r["reason"],
                    json.loads(r["plan"]), bool(r["executed"]))


def _journal_error(exc: Exception) -> JournalError:
    """A database failure as the journal's error: text the database cannot store fails the same
    way again (JournalValueError), anything else may pass (JournalError)."""
    if isinstance(exc, UnstorableText):
        return JournalValueError(str(exc))
    return JournalError(f"journal write failed: {type(exc).__name__}: {exc}")


def is_postgres(store: Path | str) -> bool:
    """Whether `store` names a PostgreSQL database (a postgres:// or postgresql:// URI)."""
    return isinstance(store, str) and store.startswith(("postgres://", "postgresql://"))


def connect(store: Path | str | Backend, busy_timeout_seconds: float = 5.0, pool_size: int = 4) -> Backend:
    """The backend for `store`: a PostgreSQL URI, else a SQLite file (a backend passes through)."""
    if not isinstance(store, (str, Path)):
        return store
    if is_postgres(store):
        # Imported here: a SQLite-only install never loads the PostgreSQL driver.
        from daemon.storage.postgres_backend import PostgresBackend

        return PostgresBackend(str(store), pool_size=pool_size, connect_timeout_seconds=busy_timeout_seconds)
    from daemon.storage.sqlite_backend import SqliteBackend

    return SqliteBackend(store, busy_timeout_seconds)
