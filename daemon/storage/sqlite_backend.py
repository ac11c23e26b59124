"""The embedded journal database: one SQLite file in WAL mode (a single replica, local runs, the
demo). Its schema and migrations live here; the journal's SQL is shared (its repositories,
daemon/storage/journal.py)."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Sequence

from daemon.storage.backend import Backend, Cursor, Migration, apply_migrations, statements

# Version 1: the schema as released before versioned migrations (CREATE ... IF NOT EXISTS, so a
# journal of any earlier release is brought forward by it; its columns added by _add_columns).
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
    phase TEXT NOT NULL,       -- intent | apply | verify | revert | recovery | escalate
    status TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}',
    at REAL NOT NULL,
    duration_seconds REAL
);
CREATE INDEX IF NOT EXISTS steps_phase ON steps(phase, decision_id);
CREATE TABLE IF NOT EXISTS evaluations (
    policy TEXT NOT NULL,
    trigger_index INTEGER NOT NULL,
    series TEXT NOT NULL,
    at REAL NOT NULL,
    fired INTEGER NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (policy, trigger_index, series)
);
-- Live pins, one per target (columns after `at` added by _migrate on older journals).
CREATE TABLE IF NOT EXISTS pins (
    target TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    at REAL NOT NULL,
    from_version INTEGER,      -- the version rolled back from (NULL: unknown, an older pin)
    decision_id INTEGER,
    signal TEXT,
    reason TEXT NOT NULL DEFAULT '',
    policy TEXT
);
-- Pins that ended (roll-forward, policy disabled or removed, unpin, revert), with why.
CREATE TABLE IF NOT EXISTS pin_history (
    id INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    at REAL NOT NULL,
    from_version INTEGER,
    decision_id INTEGER,
    signal TEXT,
    reason TEXT NOT NULL DEFAULT '',
    policy TEXT,
    ended_at REAL NOT NULL,
    ended_reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS pin_history_target ON pin_history(target, ended_at);
-- Versions rolled back from: `to: previous` skips them until `tailguard bad-versions --clear`.
CREATE TABLE IF NOT EXISTS bad_versions (
    id INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
    version INTEGER NOT NULL,
    reason TEXT NOT NULL,
    decision_id INTEGER,
    at REAL NOT NULL,
    cleared_at REAL,
    cleared_reason TEXT
);
CREATE INDEX IF NOT EXISTS bad_versions_target ON bad_versions(target, cleared_at);
-- Executed plans of the previous leader, imported from the shared cluster state on takeover:
-- guard_history counts them with the local decisions (an identical `at` counts once).
CREATE TABLE IF NOT EXISTS guard_marks (
    policy TEXT NOT NULL,
    target TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (policy, target, at)
);
-- A target frozen after a remediation that did not help: no policy acts on it until `until` or
-- until `tailguard unfreeze` lifts it (lifted_at).
CREATE TABLE IF NOT EXISTS freezes (
    id INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL,
    until REAL NOT NULL,
    decision_id INTEGER,
    lifted_at REAL,
    lifted_reason TEXT
);
CREATE INDEX IF NOT EXISTS freezes_target ON freezes(target, until);
-- Plans of policies with `approval: required`, waiting for an operator until `deadline`.
CREATE TABLE IF NOT EXISTS approvals (
    id INTEGER PRIMARY KEY,
    decision_id INTEGER NOT NULL REFERENCES decisions(id),
    policy TEXT NOT NULL,
    target TEXT NOT NULL,
    requested_at REAL NOT NULL,
    deadline REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',   -- pending | approved | expired
    decided_at REAL,
    decided_by TEXT,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS approvals_status ON approvals(status, policy, target);
"""

# Columns added to existing tables since the first release: (name, declaration) per table.
_ADDED_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "pins": [("from_version", "INTEGER"), ("decision_id", "INTEGER"), ("signal", "TEXT"),
             ("reason", "TEXT NOT NULL DEFAULT ''"), ("policy", "TEXT")],
    # Who froze or lifted (an API token's name, a ConfigMap's field manager) and how.
    "freezes": [("by", "TEXT"), ("source", "TEXT"), ("lifted_by", "TEXT")],
}


def _add_columns(backend: Backend) -> None:
    """Add the columns an older journal lacks (tables it lacked SCHEMA created). Idempotent."""
    for table, columns in _ADDED_COLUMNS.items():
        have = {r["name"] for r in backend.execute(f"PRAGMA table_info({table})").fetchall()}
        for name, decl in columns:
            if name not in have:
                backend.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")


# Version 2: the writer's fencing token. `leadership` holds the term handed to the replica that
# last became leader; each decision records the holder and term that claimed it.
FENCING = """
CREATE TABLE IF NOT EXISTS leadership (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    term INTEGER NOT NULL,
    holder TEXT NOT NULL,
    lease_transitions INTEGER,
    since REAL NOT NULL
);
ALTER TABLE decisions ADD COLUMN holder TEXT;
ALTER TABLE decisions ADD COLUMN term INTEGER;
"""

EFFECTS = """
CREATE TABLE IF NOT EXISTS effects (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    writer TEXT NOT NULL,      -- executor | pins | revert: who asked the door (daemon/workers/door.py)
    target TEXT NOT NULL,
    kind TEXT NOT NULL,        -- triton.load | kube.patch | sink.write | pin.repin | pin.escalated
    status TEXT NOT NULL,      -- intent | done | failed | refused
    message TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}',
    term INTEGER,
    decision_id INTEGER
);
CREATE INDEX IF NOT EXISTS effects_target ON effects(target, kind, at);
"""

# Version 4: when each version of a target started serving, per detector trigger (its fingerprint):
# tail_excess's start test resumes from it after a restart (daemon/storage/starts.py).
STARTS = """
CREATE TABLE IF NOT EXISTS version_starts (
    target TEXT NOT NULL,
    trigger_key TEXT NOT NULL,
    version TEXT NOT NULL,
    started_at REAL NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (target, trigger_key, version)
);
"""

# Version 5: a fence term per shard (daemon/storage/shard_terms.py): with sharding on, each shard's
# Lease holder takes its shard's term, and the door refuses a write whose shard term is not current.
SHARD_TERMS = """
CREATE TABLE IF NOT EXISTS shard_terms (
    shard INTEGER PRIMARY KEY,
    term INTEGER NOT NULL,
    holder TEXT NOT NULL,
    shards INTEGER NOT NULL,   -- the shard count the term was taken under (replicas must agree)
    since REAL NOT NULL
);
"""

# Every schema change is a new entry here and the same change in postgres_backend.MIGRATIONS
# (tests/unit/test_journal_backends.py compares the two schemas).
MIGRATIONS = (
    Migration(1, "journal schema as of the first PostgreSQL release", SCHEMA, _add_columns),
    Migration(2, "leadership terms: fencing tokens for writes of the replica that acts", FENCING),
    Migration(3, "effects: every write the door let through or refused, intent and result", EFFECTS),
    Migration(4, "version starts: when each version started, as a detector trigger saw it", STARTS),
    Migration(5, "shard terms: a fencing token per shard when targets are sharded across replicas", SHARD_TERMS),
)


class SqliteBackend:
    """One SQLite connection (the journal's lock serializes its use across threads)."""

    name = "sqlite"
    concurrent_reads = False
    errors_abort_transaction = False
    json_ids = "SELECT value FROM json_each(?)"
    share_lock = ""  # BEGIN IMMEDIATE already serializes every write transaction

    def __init__(self, path: Path | str, busy_timeout_seconds: float = 5.0) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None,
                                   timeout=busy_timeout_seconds)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a webhook answered 2xx must survive a power cut, not only a process crash.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")

    def json_text(self, column: str, key: str) -> str:
        return f"json_extract({column}, '$.{key}')"

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        return self._db.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._db.executemany(sql, rows)

    def execute_script(self, script: str) -> None:
        # Not executescript(): it commits first, and the migration must stay one transaction.
        for statement in statements(script):
            self._db.execute(statement)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._db.execute(sql, params).fetchall()

    def begin(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self._db.execute("COMMIT")

    def rollback(self) -> None:
        try:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # the journal rolls back again before its next BEGIN (or it is closed)

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    def lock_schema(self) -> None:
        pass  # BEGIN IMMEDIATE already holds the write lock

    def migrate(self) -> int:
        return apply_migrations(self, MIGRATIONS)

    def announce(self, channel: str, payload: str) -> None:
        pass  # one process per SQLite journal: nobody else to tell

    def describe(self) -> str:
        return str(self.path)

    def close(self) -> None:
        self._db.close()
