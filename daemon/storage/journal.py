"""The journal (SQLite, WAL): every signal, decision, step and outcome, written before it is
acknowledged. It is the source of truth for dedup, cooldowns and pins after a restart."""
from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Concatenate, Iterable, ParamSpec, Sequence, TypeVar

from core.decision import DecisionState
from core.signal import Signal

P = ParamSpec("P")
T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS signals (
    id INTEGER PRIMARY KEY,
    dedup_key TEXT NOT NULL UNIQUE,
    source TEXT NOT NULL,
    name TEXT NOT NULL,
    policy TEXT,
    received_at REAL NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',   -- pending | processed
    processed_at REAL
);
CREATE INDEX IF NOT EXISTS signals_state ON signals(state);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY,
    signal_id INTEGER NOT NULL REFERENCES signals(id),
    policy TEXT NOT NULL,
    target TEXT NOT NULL,
    at REAL NOT NULL,
    state TEXT NOT NULL,       -- blocked | dry_run | noop | executing | succeeded | failed | reverted
    reason TEXT NOT NULL DEFAULT '',
    plan TEXT NOT NULL DEFAULT '{}',
    executed INTEGER NOT NULL DEFAULT 0,  -- counts for cooldown and rate limit
    UNIQUE(signal_id, policy)
);
CREATE INDEX IF NOT EXISTS decisions_guard ON decisions(policy, target, executed, at);
CREATE TABLE IF NOT EXISTS steps (
    id INTEGER PRIMARY KEY,
    decision_id INTEGER NOT NULL REFERENCES decisions(id),
    idx INTEGER NOT NULL,
    action TEXT NOT NULL,
    phase TEXT NOT NULL,       -- apply | verify | revert
    status TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}',
    at REAL NOT NULL,
    duration_seconds REAL
);
CREATE TABLE IF NOT EXISTS evaluations (
    policy TEXT NOT NULL,
    trigger_index INTEGER NOT NULL,
    series TEXT NOT NULL,
    at REAL NOT NULL,
    fired INTEGER NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (policy, trigger_index, series)
);
CREATE TABLE IF NOT EXISTS pins (
    target TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    at REAL NOT NULL
);
-- Executed plans of the previous leader, imported from the shared cluster state on takeover:
-- guard_history counts them with the local decisions (an identical `at` counts once).
CREATE TABLE IF NOT EXISTS guard_marks (
    policy TEXT NOT NULL,
    target TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (policy, target, at)
);
"""


@dataclass(frozen=True)
class StoredSignal:
    id: int
    dedup_key: str
    payload: dict[str, Any]
    state: str


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


class JournalError(Exception):
    """The journal could not be written; callers must not acknowledge what they could not record."""


class Journal:
    """Thread-safe SQLite journal; the async methods run the blocking calls in a worker thread."""

    def __init__(self, path: Path | str, busy_timeout_seconds: float = 5.0) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None,
                                   timeout=busy_timeout_seconds)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a webhook answered 2xx must survive a power cut, not only a process crash.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self, fn: Callable[[], T]) -> T:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                result = fn()
                self._db.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise JournalError(f"journal write failed: {exc}") from exc

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise JournalError(f"journal read failed: {exc}") from exc

    # ---- signals ----------------------------------------------------------------------------

    def record_signals(self, signals: Iterable[Signal]) -> tuple[list[tuple[int, Signal]], int]:
        """Insert signals in one transaction. Returns ((id, signal) of new ones, number of duplicates)."""
        sigs = list(signals)

        def run() -> tuple[list[tuple[int, Signal]], int]:
            new: list[tuple[int, Signal]] = []
            dup = 0
            now = time.time()
            for s in sigs:
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO signals(dedup_key, source, name, policy, received_at, payload)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (s.dedup_key, s.source.value, s.name, s.policy, now, json.dumps(s.summary())),
                )
                if cur.rowcount == 1:
                    new.append((int(cur.lastrowid or 0), s))
                else:
                    dup += 1
            return new, dup

        return self._tx(run)

    def pending_signals(self) -> list[StoredSignal]:
        rows = self._read("SELECT id, dedup_key, payload, state FROM signals WHERE state='pending' ORDER BY id")
        return [StoredSignal(r["id"], r["dedup_key"], json.loads(r["payload"]), r["state"]) for r in rows]

    def mark_processed(self, signal_id: int) -> None:
        self._tx(lambda: self._db.execute(
            "UPDATE signals SET state='processed', processed_at=? WHERE id=?", (time.time(), signal_id)))

    def signals(self) -> list[dict[str, Any]]:
        rows = self._read("SELECT * FROM signals ORDER BY id")
        return [dict(r) | {"payload": json.loads(r["payload"])} for r in rows]

    # ---- decisions and steps ----------------------------------------------------------------

    def decision_for(self, signal_id: int, policy: str) -> Decision | None:
        rows = self._read("SELECT * FROM decisions WHERE signal_id=? AND policy=?", (signal_id, policy))
        return _decision(rows[0]) if rows else None

    def record_decision(self, signal_id: int, policy: str, target: str, state: DecisionState, reason: str,
                        plan: dict[str, Any], executed: bool) -> int:
        def run() -> int:
            cur = self._db.execute(
                "INSERT INTO decisions(signal_id, policy, target, at, state, reason, plan, executed)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(signal_id, policy) DO UPDATE SET state=excluded.state,"
                " reason=excluded.reason, plan=excluded.plan, executed=MAX(executed, excluded.executed)",
                (signal_id, policy, target, time.time(), state, reason, json.dumps(plan), int(executed)),
            )
            row = self._db.execute("SELECT id FROM decisions WHERE signal_id=? AND policy=?",
                                   (signal_id, policy)).fetchone()
            return int(row["id"] if row else cur.lastrowid or 0)

        return self._tx(run)

    def finish_decision(self, decision_id: int, state: DecisionState, reason: str) -> None:
        self._tx(lambda: self._db.execute(
            "UPDATE decisions SET state=?, reason=? WHERE id=?", (state, reason, decision_id)))

    def record_step(self, decision_id: int, idx: int, action: str, phase: str, status: str,
                    message: str, data: dict[str, Any], duration_seconds: float | None) -> None:
        self._tx(lambda: self._db.execute(
            "INSERT INTO steps(decision_id, idx, action, phase, status, message, data, at, duration_seconds)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (decision_id, idx, action, phase, status, message, json.dumps(data, default=str),
             time.time(), duration_seconds)))

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
            " UNION SELECT at FROM guard_marks WHERE policy=? AND target=?)",
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
            decisions = self._db.execute("DELETE FROM decisions WHERE at < ?", (before,)).rowcount
            signals = self._db.execute(
                "DELETE FROM signals WHERE state='processed' AND received_at < ?"
                " AND id NOT IN (SELECT signal_id FROM decisions)", (before,)).rowcount
            evaluations = self._db.execute("DELETE FROM evaluations WHERE at < ?", (before,)).rowcount
            return {"signals": signals, "decisions": decisions, "steps": steps, "evaluations": evaluations}

        return self._tx(run)

    # ---- detector evaluations and pins -------------------------------------------------------

    def record_evaluation(self, policy: str, trigger_index: int, series: str, fired: bool,
                          reason: str) -> None:
        """The latest verdict per series (no signal is also an answer, with its reason)."""
        self._tx(lambda: self._db.execute(
            "INSERT INTO evaluations(policy, trigger_index, series, at, fired, reason) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(policy, trigger_index, series) DO UPDATE SET at=excluded.at,"
            " fired=excluded.fired, reason=excluded.reason",
            (policy, trigger_index, series, time.time(), int(fired), reason)))

    def record_evaluations(self, rows: Sequence[tuple[str, int, str, bool, str]]) -> None:
        """Many verdicts (policy, trigger index, series, fired, reason) in one transaction:
        a poll cycle over thousands of series must not pay one fsync per series."""
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

    def record_pin(self, target: str, model: str, version: int) -> None:
        """Remember that `target` must serve only `version` (re-applied to new replicas)."""
        self._tx(lambda: self._db.execute(
            "INSERT INTO pins(target, model, version, at) VALUES (?,?,?,?)"
            " ON CONFLICT(target) DO UPDATE SET model=excluded.model, version=excluded.version,"
            " at=excluded.at",
            (target, model, version, time.time())))

    def clear_pin(self, target: str) -> None:
        self._tx(lambda: self._db.execute("DELETE FROM pins WHERE target=?", (target,)))

    def pins(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._read("SELECT * FROM pins")]

    def merge_cluster_state(self, pins: Iterable[tuple[str, str, int, float]],
                            marks: Iterable[tuple[str, str, float]], since: float) -> tuple[int, int]:
        """Import what another leader recorded, in one transaction.

        Args:
            pins: (target, model, version, at); the newer `at` wins over a local pin.
            marks: (policy, target, at) of executed plans, counted by guard_history from now on.
            since: imported marks at or before this are dropped (they can no longer block anything).

        Returns:
            (pins inserted or replaced, marks added).
        """
        pin_rows, mark_rows = list(pins), list(marks)

        def run() -> tuple[int, int]:
            changed = added = 0
            for target, model, version, at in pin_rows:
                changed += self._db.execute(
                    "INSERT INTO pins(target, model, version, at) VALUES (?,?,?,?)"
                    " ON CONFLICT(target) DO UPDATE SET model=excluded.model, version=excluded.version,"
                    " at=excluded.at WHERE excluded.at > pins.at",
                    (target, model, int(version), float(at))).rowcount
            for policy, target, at in mark_rows:
                if at > since:
                    added += self._db.execute(
                        "INSERT OR IGNORE INTO guard_marks(policy, target, at) VALUES (?,?,?)",
                        (policy, target, float(at))).rowcount
            self._db.execute("DELETE FROM guard_marks WHERE at <= ?", (since,))
            return changed, added

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

    record_signals = _in_thread(Journal.record_signals)
    pending_signals = _in_thread(Journal.pending_signals)
    mark_processed = _in_thread(Journal.mark_processed)
    signals = _in_thread(Journal.signals)
    decision_for = _in_thread(Journal.decision_for)
    record_decision = _in_thread(Journal.record_decision)
    finish_decision = _in_thread(Journal.finish_decision)
    record_step = _in_thread(Journal.record_step)
    decisions = _in_thread(Journal.decisions)
    steps = _in_thread(Journal.steps)
    guard_history = _in_thread(Journal.guard_history)
    executed_marks = _in_thread(Journal.executed_marks)
    prune = _in_thread(Journal.prune)
    record_evaluation = _in_thread(Journal.record_evaluation)
    record_evaluations = _in_thread(Journal.record_evaluations)
    evaluations = _in_thread(Journal.evaluations)
    record_pin = _in_thread(Journal.record_pin)
    clear_pin = _in_thread(Journal.clear_pin)
    pins = _in_thread(Journal.pins)
    merge_cluster_state = _in_thread(Journal.merge_cluster_state)


def _decision(r: sqlite3.Row) -> Decision:
    return Decision(r["id"], r["signal_id"], r["policy"], r["target"], r["at"], DecisionState(r["state"]), r["reason"],
                    json.loads(r["plan"]), bool(r["executed"]))
