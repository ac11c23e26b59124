"""What one repository writes or reads of another's table, in one place, so that the repositories
stay independent of each other (an import-linter contract in pyproject.toml): the rows added inside
another repository's transaction (a recovery verdict's freeze, a rollback's bad-version mark, an
ended pin's history row) and the reads that cross tables. Every function runs inside the caller's
transaction, on the database it was handed."""
from __future__ import annotations

from daemon.storage.backend import Backend, Row
from daemon.storage.records import Pin


def insert_freeze(db: Backend, target: str, reason: str, until: float, decision_id: int | None,
                  by: str | None = None, source: str | None = None, *, at: float) -> int:
    """The freezes row stamped `at` (a recovery verdict escalates with one); its id."""
    row = db.execute('INSERT INTO freezes(target, reason, at, until, decision_id, "by", source)'
                     " VALUES (?,?,?,?,?,?,?) RETURNING id",
                     (target, reason, at, until, decision_id, by, source)).fetchone()
    return int(row["id"])


def insert_mark(db: Backend, target: str, version: int, reason: str, decision_id: int | None, now: float) -> bool:
    """The bad-version mark, unless one is in force already (a pin's rollback marks the version it
    rolled back from); whether it was added."""
    if db.execute("SELECT 1 FROM bad_versions WHERE target=? AND version=? AND cleared_at IS NULL",
                  (target, version)).fetchone() is not None:
        return False
    db.execute("INSERT INTO bad_versions(target, version, reason, decision_id, at)"
               " VALUES (?,?,?,?,?)", (target, version, reason, decision_id, now))
    return True


def insert_ended(db: Backend, pin: Pin, ended_at: float, reason: str) -> int:
    """The pin_history row of the live pin `pin`, ended at `ended_at`; its id."""
    row = db.execute(
        "INSERT INTO pin_history(target, model, version, at, from_version, decision_id, signal, reason,"
        " policy, ended_at, ended_reason) VALUES (?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
        (pin.target, pin.model, pin.version, pin.at, pin.from_version, pin.decision_id, pin.signal,
         pin.reason or "", pin.policy, ended_at, reason)).fetchone()
    return int(row["id"])


def pin_from_row(r: Row) -> Pin:
    """A pins row (or the pin part of a pin_history row)."""
    return Pin(r["target"], r["model"], r["version"], r["at"], r["from_version"], r["decision_id"], r["signal"],
               r["reason"], r["policy"])


def decision_signal_name(db: Backend, decision_id: int) -> str | None:
    """The name of the signal the decision answered (None: no such decision)."""
    row = db.execute("SELECT s.name FROM decisions d JOIN signals s ON s.id=d.signal_id"
                     " WHERE d.id=?", (decision_id,)).fetchone()
    return row["name"] if row is not None else None
