"""The signals table: the intake (group-committed, bounded by the pending backlog), the pending set
the workers take from, and the signals journaled."""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from core.signal import Signal
from daemon.storage.backend import SIGNALS_CHANNEL, Backend
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked, decode_payload, journal_error
from daemon.storage.errors import JournalBackpressure, JournalError, JournalValueError
from daemon.storage.group_commit import GroupCommit
from daemon.storage.records import NewSignal, OnCommit, SignalRow, SignalsRecorded, StoredSignal

DEFAULT_MAX_PENDING = 100_000
INSERT_CHUNK = 1_000  # rows per INSERT statement (6 parameters each, under SQLite's 32,766)


@dataclass(frozen=True)
class SignalBatch:
    """One caller's signals for a group commit, with their rows (checked, serialized by the caller:
    the writer's turn stays short); `on_commit` runs once they are committed."""

    signals: list[Signal]
    rows: list[tuple[Any, ...]]
    on_commit: OnCommit | None = None


class Signals:
    """The journal's signals.

    Args:
        core: The journal's core.
        max_pending: Bound on pending signals; past it, recording signals raises
            JournalBackpressure instead of growing the backlog.
    """

    def __init__(self, core: JournalCore, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self._core = core
        self.max_pending = max_pending
        # Kept exact by every write that changes a signal's state (all of them go through here).
        self._pending = core.opening(
            lambda db: int(db.query("SELECT COUNT(*) AS n FROM signals WHERE state='pending'")[0]["n"]))
        self._group: GroupCommit[SignalBatch, SignalsRecorded] = GroupCommit(self.record_batches, "journal-writer")
        self._listener: tuple[asyncio.AbstractEventLoop, OnCommit] | None = None

    def close(self) -> None:
        """Write what the group commit holds, then stop its writer; later intake fails with JournalError."""
        self._group.close()

    # ---- intake -------------------------------------------------------------------------------

    def record(self, signals: Iterable[Signal]) -> SignalsRecorded:
        """Insert signals in one transaction. Returns ((id, signal) of new ones, number of duplicates).

        Raises:
            JournalValueError: a text value cannot be stored; nothing was written.
            JournalBackpressure: more than `max_pending` signals are pending; nothing was written.
            JournalError: the journal could not be written.
        """
        (result,) = self.record_batches([self._batch(signals)])
        if isinstance(result, JournalError):
            raise result
        return result

    def submit(self, signals: Iterable[Signal], on_commit: OnCommit | None = None) -> Future[SignalsRecorded]:
        """record through the group commit: concurrent callers share one transaction.
        The future completes once the signals are committed; `on_commit` runs just before."""
        try:
            batch = self._batch(signals, on_commit)
        except JournalValueError as exc:
            failed: Future[SignalsRecorded] = Future()
            failed.set_exception(exc)
            return failed
        return self._group.submit(batch)

    def on_intake(self, listener: OnCommit | None) -> None:
        """Call `listener` on this event loop with the (id, signal) of the new signals of every
        intake call, in commit order, once committed and before that call returns; None stops.
        Scheduled while the journal is still locked after the commit, so a read of the journal
        that this loop sees complete later was made after the listener was called."""
        self._listener = None if listener is None else (asyncio.get_running_loop(), listener)

    async def intake(self, signals: Iterable[Signal]) -> SignalsRecorded:
        """record from the event loop, group-committed: concurrent callers share one transaction
        (one fsync); each gets its own result once its signals are committed (see on_intake)."""
        on_commit: OnCommit | None = None
        if self._listener is not None:
            loop, listener = self._listener

            def on_commit(new: list[NewSignal]) -> None:
                loop.call_soon_threadsafe(listener, new)

        return await asyncio.wrap_future(self.submit(signals, on_commit))

    def _batch(self, signals: Iterable[Signal], on_commit: OnCommit | None = None) -> SignalBatch:
        """The batch of `signals`, every text checked (JournalValueError before anything is written)."""
        sigs, now = list(signals), self._core.clock()
        return SignalBatch(sigs, [signal_row(n, s, now) for n, s in enumerate(sigs)], on_commit)

    def record_batches(self, batches: Sequence[SignalBatch]) -> list[SignalsRecorded | JournalError]:
        """Several callers' signals in one transaction (one fsync). Each caller's signals are
        written all or none and get the result record would give it, duplicates across callers
        included (the earlier batch inserts, the later one counts a duplicate). Raises
        JournalError when the transaction itself fails (then every caller failed)."""
        results: list[SignalsRecorded | JournalError] = [SignalsRecorded([], 0) for _ in batches]

        def run(db: Backend) -> int:
            pending = self._pending
            for i, batch in enumerate(batches):
                if not batch.rows:
                    continue
                if pending >= self.max_pending:
                    results[i] = JournalBackpressure(
                        f"{pending} signals pending (bound {self.max_pending}); retry later")
                    continue
                try:
                    new, dup = self._insert(db, batch.signals, batch.rows)
                except Exception as exc:
                    if not db.in_transaction:  # SQLite gave the whole transaction up (disk full ...)
                        raise
                    results[i] = journal_error(exc)
                else:
                    results[i] = SignalsRecorded(new, dup)
                    pending += len(new)
            if pending > self._pending:  # a replica leading a shared journal reads them now (journal_notices)
                db.announce(SIGNALS_CHANNEL, self._core.instance)
            return pending

        def committed(pending: int) -> None:
            self._pending = pending
            for batch, result in zip(batches, results):
                if batch.on_commit is not None and isinstance(result, SignalsRecorded) and result.new:
                    try:
                        batch.on_commit(result.new)
                    except Exception:  # a listener gone (its loop closed): the rows stay pending, found by
                        pass  # the next reader of the journal

        self._core.write(run, after_commit=committed)
        return results

    def _insert(self, db: Backend, signals: Sequence[Signal], rows: Sequence[tuple[Any, ...]]) -> SignalsRecorded:
        """One caller's signals, all or none: one statement per INSERT_CHUNK rows (a statement is
        atomic; several are wrapped in a savepoint). Few statements, because the writer thread
        takes the GIL back after each one, and the event loop holds it most of the time."""
        chunks = [rows[i:i + INSERT_CHUNK] for i in range(0, len(rows), INSERT_CHUNK)]
        # On PostgreSQL any failed statement spoils the transaction: the savepoint lets this
        # caller fail alone there too.
        savepoint = len(chunks) > 1 or db.errors_abort_transaction
        if savepoint:
            db.execute("SAVEPOINT batch")
        try:
            inserted: dict[str, int] = {}
            for chunk in chunks:
                cur = db.execute(
                    "INSERT INTO signals(dedup_key, source, name, policy, received_at, payload) VALUES "
                    + ",".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk)) + " ON CONFLICT DO NOTHING RETURNING id, dedup_key",
                    [value for row in chunk for value in row])
                inserted.update((r["dedup_key"], int(r["id"])) for r in cur.fetchall())
        except BaseException:
            if savepoint and db.in_transaction:
                db.execute("ROLLBACK TO batch")
                db.execute("RELEASE batch")
            raise
        if savepoint:
            db.execute("RELEASE batch")
        new: list[NewSignal] = []
        for s in signals:
            # Only inserted rows come back: a key seen before (or twice in this batch) is a duplicate.
            signal_id = inserted.pop(s.dedup_key, None)
            if signal_id is not None:
                new.append(NewSignal(signal_id, s))
        return SignalsRecorded(new, len(signals) - len(new))

    # ---- the pending set ----------------------------------------------------------------------

    @blocking
    def pending(self, limit: int | None = None, after_id: int = 0) -> list[StoredSignal]:
        """Pending signals in id order: all of them, or `limit` from the first id above `after_id`."""
        rows = self._core.read("SELECT id, dedup_key, payload, state, received_at FROM signals"
                               " WHERE state='pending' AND id > ? ORDER BY id" + ("" if limit is None else " LIMIT ?"),
                               (after_id,) if limit is None else (after_id, limit))
        return [StoredSignal(r["id"], r["dedup_key"], decode_payload(r["payload"]), r["state"], float(r["received_at"]))
                for r in rows]

    @blocking
    def pending_count(self) -> int:
        """How many signals are pending (what JournalBackpressure compares with `max_pending`)."""
        with self._core.exclusive():
            return self._pending

    @blocking
    def mark_processed(self, signal_ids: Sequence[int]) -> int:
        """Mark signals processed in one transaction; returns how many were still pending."""
        # One statement (the ids as a JSON array), not one per id: see _insert.
        ids = json.dumps([int(i) for i in signal_ids])
        return self._core.fenced_write(lambda db: db.execute(
            "UPDATE signals SET state='processed', processed_at=? WHERE state='pending'"
            f" AND id IN ({db.json_ids})", (self._core.clock(), ids)).rowcount,
            after_commit=self._processed)

    def _processed(self, count: int) -> None:
        self._pending = max(0, self._pending - count)

    @blocking
    def refresh_pending(self) -> int:
        """Count the pending signals again from the database. On a journal several replicas share,
        the count kept by this process misses the others' writes (their intake, the leader's marks):
        the service refreshes it periodically, so backpressure follows the shared backlog."""
        count = int(self._core.read("SELECT COUNT(*) AS n FROM signals WHERE state='pending'")[0]["n"])
        with self._core.exclusive():
            self._pending = count
        return count

    # ---- reads --------------------------------------------------------------------------------

    @blocking
    def all(self) -> list[SignalRow]:
        """Every signal row, its payload decoded, in id order."""
        rows = self._core.read("SELECT id, dedup_key, source, name, policy, received_at, payload, state, processed_at"
                               " FROM signals ORDER BY id")
        return [SignalRow(int(r["id"]), r["dedup_key"], r["source"], r["name"], r["policy"], float(r["received_at"]),
                          decode_payload(r["payload"]), r["state"],
                          None if r["processed_at"] is None else float(r["processed_at"])) for r in rows]

    @blocking
    def since(self, since: float) -> list[StoredSignal]:
        """Every signal journaled after `since`, pending or processed, in id order (common cause)."""
        rows = self._core.read("SELECT id, dedup_key, payload, state, received_at FROM signals"
                               " WHERE received_at > ? ORDER BY id", (since,))
        return [StoredSignal(r["id"], r["dedup_key"], decode_payload(r["payload"]), r["state"], float(r["received_at"]))
                for r in rows]

    @blocking
    def get(self, signal_id: int) -> StoredSignal | None:
        rows = self._core.read("SELECT id, dedup_key, payload, state, received_at FROM signals WHERE id=?",
                               (signal_id,))
        return (StoredSignal(rows[0]["id"], rows[0]["dedup_key"], json.loads(rows[0]["payload"]), rows[0]["state"],
                             float(rows[0]["received_at"])) if rows else None)


def signal_row(n: int, s: Signal, now: float) -> tuple[Any, ...]:
    """The signals row of `s` (the n-th of its batch), every text checked."""
    dedup_key, source, name, policy = s.dedup_key, s.source.value, s.name, s.policy
    # ASCII text is always storable: checked (which names the field) only where some is not.
    if not (isinstance(dedup_key, str) and isinstance(source, str) and isinstance(name, str)
            and (dedup_key + source + name).isascii() and (policy is None or isinstance(policy, str) and policy.isascii())):
        prefix = f"signal {n} "
        checked(**{prefix + "dedup_key": dedup_key, prefix + "source": source, prefix + "name": name,
                   prefix + "policy": policy})
    # ensure_ascii (the default): the payload is always storable, escapes included.
    return (dedup_key, source, name, policy, now, s.summary_json())
