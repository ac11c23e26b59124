"""The journal: every signal, decision, step and outcome, written before it is acknowledged. It is
the source of truth for dedup, cooldowns and pins after a restart. One API and one set of SQL on
two databases (daemon/storage/sqlite_backend.py embedded, postgres_backend.py shared).

The journal is its core (daemon/storage/core.py: transactions, reads, fencing) with one repository
per table as attributes: `journal.signals`, `journal.decisions` (with their steps),
`journal.freezes`, `journal.approvals`, `journal.evaluations`, `journal.pins`,
`journal.bad_versions`, `journal.terms`, and `journal.cluster` for what the cluster state shares.
Their methods block; from the event loop, await them in a worker thread with `.in_thread(...)`
(daemon/storage/blocking.py), and record signals with `await journal.signals.intake(...)`."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from daemon.storage.approvals import Approvals
from daemon.storage.backend import Backend
from daemon.storage.bad_versions import BadVersions
from daemon.storage.blocking import blocking
from daemon.storage.cluster_merge import ClusterMerge
from daemon.storage.core import JournalCore
from daemon.storage.decisions import Decisions
from daemon.storage.effects import Effects
from daemon.storage.evaluations import Evaluations
from daemon.storage.freezes import Freezes
from daemon.storage.history_bound import prune_history
from daemon.storage.pins import Pins
from daemon.storage.shard_terms import ShardTerms
from daemon.storage.signals import DEFAULT_MAX_PENDING, Signals
from daemon.storage.starts import Starts
from daemon.storage.terms import Terms


class Journal(JournalCore):
    """Thread-safe journal on SQLite or PostgreSQL, one repository per table.

    Args:
        store: A SQLite file (or ":memory:"), a postgres:// or postgresql:// URI, or a backend.
        busy_timeout_seconds: How long SQLite waits for a lock, PostgreSQL for a connection.
        max_pending: Bound on pending signals; past it, recording signals raises
            JournalBackpressure instead of growing the backlog.
        statement_timeout_seconds, lock_timeout_seconds, clock: as JournalCore's.
    """

    def __init__(self, store: Path | str | Backend, busy_timeout_seconds: float = 5.0,
                 max_pending: int = DEFAULT_MAX_PENDING, *, statement_timeout_seconds: float | None = None,
                 lock_timeout_seconds: float | None = None, clock: Callable[[], float] = time.time) -> None:
        super().__init__(store, busy_timeout_seconds, statement_timeout_seconds=statement_timeout_seconds,
                         lock_timeout_seconds=lock_timeout_seconds, clock=clock)
        self.signals = Signals(self, max_pending)
        self.shard_terms = ShardTerms(self)  # a fence term per shard (sharding.shards > 1)
        self.decisions = Decisions(self, self.shard_terms.fence_target)  # decision rows fenced per shard too
        self.freezes = Freezes(self)
        self.approvals = Approvals(self)
        self.evaluations = Evaluations(self)
        self.pins = Pins(self)
        self.bad_versions = BadVersions(self)
        self.terms = Terms(self)
        self.effects = Effects(self)  # the door's writes and refusals (daemon/workers/door.py)
        self.cluster = ClusterMerge(self)
        self.starts = Starts(self)  # versions' starts as detector triggers saw them (start tests)

    def close(self) -> None:
        self.signals.close()
        super().close()

    @blocking
    def prune(self, before: float) -> dict[str, int]:
        """Delete what is older than `before`: decisions (with their steps), processed signals left
        without decisions, stale evaluations. Pending signals and pins are never pruned; the
        retention must exceed every guard window (config enforces at least a day)."""

        def run(db: Backend) -> dict[str, int]:
            old = "SELECT id FROM decisions WHERE at < ?"
            steps = db.execute(f"DELETE FROM steps WHERE decision_id IN ({old})", (before,)).rowcount
            db.execute(f"DELETE FROM approvals WHERE decision_id IN ({old})", (before,))
            decisions = db.execute("DELETE FROM decisions WHERE at < ?", (before,)).rowcount
            signals = db.execute(
                "DELETE FROM signals WHERE state='processed' AND received_at < ?"
                " AND id NOT IN (SELECT signal_id FROM decisions)", (before,)).rowcount
            evaluations = db.execute("DELETE FROM evaluations WHERE at < ?", (before,)).rowcount
            db.execute("DELETE FROM freezes WHERE until < ?", (before,))  # over long ago
            db.execute("DELETE FROM version_starts WHERE at < ?", (before,))  # their start tests long over
            # The door's rows; an escalated tug of war holds its pin until an operator answers it.
            db.execute("DELETE FROM effects WHERE at < ? AND kind != 'pin.escalated'", (before,))
            return {"signals": signals, "decisions": decisions, "steps": steps, "evaluations": evaluations}

        return self.write(run)

    @blocking
    def prune_to_size(self, max_rows: int, keep_after: float) -> dict[str, int]:
        """Bound the history in size as well as age: past `max_rows` decisions (signals, effects) delete the
        oldest settled ones, never what is pending, unsettled or newer than `keep_after` that the guards
        count (daemon/storage/history_bound.py says exactly what is kept). Raises ValueError for
        `max_rows` < 1."""
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        return self.write(lambda db: prune_history(db, max_rows, keep_after))
