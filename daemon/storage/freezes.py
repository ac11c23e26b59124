"""The freezes table: targets (or the whole daemon) no policy may act on, until a time or until
lifted."""
from __future__ import annotations

import json
from typing import Sequence

from daemon.storage.backend import Backend, Row
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked
from daemon.storage.cross_table import insert_freeze
from daemon.storage.records import Freeze


class Freezes:
    """The journal's freezes."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    @blocking
    def record(self, target: str, reason: str, until: float, decision_id: int | None = None, *,
               by: str | None = None, source: str | None = None) -> int:
        """Freeze `target` (DAEMON_SCOPE: every target) until `until` (unix seconds; FOREVER: until
        lifted): no policy acts on it meanwhile. `by` and `source` say who and how."""
        checked(target=target, reason=reason, by=by, source=source)
        return self._core.write(lambda db: insert_freeze(db, target, reason, until, decision_id, by, source,
                                                         at=self._core.clock()))

    @blocking
    def active(self, now: float | None = None) -> list[Freeze]:
        """Every freeze in force at `now` (not lifted, not expired), oldest first."""
        now = self._core.clock() if now is None else now
        return [freeze_from_row(r) for r in self._core.read("SELECT * FROM freezes WHERE lifted_at IS NULL"
                                                            " AND until > ? ORDER BY at, id", (now,))]

    @blocking
    def active_on(self, target: str, now: float | None = None) -> Freeze | None:
        """The freeze on `target` that lasts longest, if one is in force at `now` (not lifted, not expired)."""
        now = self._core.clock() if now is None else now
        rows = self._core.read("SELECT * FROM freezes WHERE target=? AND lifted_at IS NULL AND until > ?"
                               " ORDER BY until DESC LIMIT 1", (target, now))
        return freeze_from_row(rows[0]) if rows else None

    @blocking
    def lift(self, target: str, reason: str, now: float | None = None, *, by: str | None = None,
             ids: Sequence[int] | None = None) -> list[Freeze]:
        """Lift the freezes in force on `target` (`tailguard unfreeze`), only those with `ids` when
        given; the ones lifted."""
        checked(target=target, reason=reason, by=by)
        at = self._core.clock() if now is None else now
        only = "" if ids is None else f" AND id IN ({self._core.sql.json_ids})"
        extra = () if ids is None else (json.dumps([int(i) for i in ids]),)

        def run(db: Backend) -> list[Freeze]:
            rows = db.execute(
                "UPDATE freezes SET lifted_at=?, lifted_reason=?, lifted_by=? WHERE target=? AND lifted_at IS NULL"
                f" AND until > ?{only} RETURNING *", (at, reason, by, target, at, *extra)).fetchall()
            return [freeze_from_row(r) for r in rows]

        return self._core.write(run)

    @blocking
    def all(self, target: str | None = None) -> list[Freeze]:
        """Every freeze journaled (in force, expired or lifted), oldest first."""
        if target is None:
            return [freeze_from_row(r) for r in self._core.read("SELECT * FROM freezes ORDER BY id")]
        return [freeze_from_row(r) for r in self._core.read("SELECT * FROM freezes WHERE target=? ORDER BY id",
                                                            (target,))]



def freeze_from_row(r: Row) -> Freeze:
    return Freeze(r["id"], r["target"], r["reason"], r["at"], r["until"], r["decision_id"], r["lifted_at"],
                  r["lifted_reason"], r["by"], r["source"], r["lifted_by"])
