"""The pins and pin_history tables: the version each target must serve (re-applied to new replicas)
and the pins that ended, with why."""
from __future__ import annotations

import dataclasses

from daemon.storage.backend import Backend, Row
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked
from daemon.storage.cross_table import decision_signal_name, insert_ended, insert_mark, pin_from_row
from daemon.storage.records import EndedPin, Pin


class Pins:
    """The journal's pins, live and ended."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    @blocking
    def record(self, target: str, model: str, version: int, *, from_version: int | None = None,
               decision_id: int | None = None, reason: str = "", policy: str | None = None) -> None:
        """Remember that `target` must serve only `version` (re-applied to new replicas).

        `from_version` (the version rolled back from) is marked bad for `target` when it is newer
        than `version`, with `reason` and `decision_id`; the signal's name is taken from the decision.
        """
        checked(target=target, model=model, reason=reason, policy=policy)

        def run(db: Backend) -> None:
            signal = None if decision_id is None else decision_signal_name(db, decision_id)
            now = self._core.clock()
            db.execute(
                "INSERT INTO pins(target, model, version, at, from_version, decision_id, signal, reason, policy)"
                " VALUES (?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT(target) DO UPDATE SET model=excluded.model, version=excluded.version,"
                " at=excluded.at, from_version=COALESCE(excluded.from_version, pins.from_version),"
                " decision_id=COALESCE(excluded.decision_id, pins.decision_id),"
                " signal=COALESCE(excluded.signal, pins.signal), reason=excluded.reason,"
                " policy=COALESCE(excluded.policy, pins.policy)",
                (target, model, version, now, from_version, decision_id, signal, reason, policy))
            if from_version is not None and from_version > version:
                insert_mark(db, target, from_version,
                            f"rolled back to {version}" + (f" by decision {decision_id}" if decision_id else "")
                            + (f" ({signal})" if signal else "") + (f": {reason}" if reason else ""),
                            decision_id, now)

        self._core.fenced_write(run)

    @blocking
    def end(self, target: str, reason: str, *, unmark_decision: bool = False) -> EndedPin | None:
        """End the live pin of `target`: moved to pin_history with `reason`. Returns the ended pin,
        or None when there was none. `unmark_decision`: also clear the bad-version marks the pin's
        decision made (its rollback was reverted)."""
        checked(target=target, reason=reason)

        def run(db: Backend) -> EndedPin | None:
            row = db.execute("SELECT * FROM pins WHERE target=?", (target,)).fetchone()
            if row is None:
                return None
            pin, now = pin_from_row(row), self._core.clock()
            history_id = insert_ended(db, pin, now, reason)
            db.execute("DELETE FROM pins WHERE target=?", (target,))
            if unmark_decision and pin.decision_id is not None:
                db.execute("UPDATE bad_versions SET cleared_at=?, cleared_reason=? WHERE target=?"
                           " AND decision_id=? AND cleared_at IS NULL",
                           (now, f"pin ended: {reason}", target, pin.decision_id))
            return EndedPin(**dataclasses.asdict(pin), id=history_id, ended_at=now, ended_reason=reason)

        return self._core.write(run)

    @blocking
    def clear(self, target: str, reason: str = "cleared") -> None:
        """End the pin of `target` (a reverted rollback): its decision's bad-version marks are cleared."""
        self.end(target, reason, unmark_decision=True)

    @blocking
    def live(self) -> list[Pin]:
        """The live pins."""
        return [pin_from_row(r) for r in self._core.read("SELECT * FROM pins")]

    @blocking
    def ended(self, target: str | None = None) -> list[EndedPin]:
        """Pins that ended, oldest first."""
        if target is None:
            rows = self._core.read("SELECT * FROM pin_history ORDER BY id")
        else:
            rows = self._core.read("SELECT * FROM pin_history WHERE target=? ORDER BY id", (target,))
        return [ended_from_row(r) for r in rows]


def ended_from_row(r: Row) -> EndedPin:
    return EndedPin(**dataclasses.asdict(pin_from_row(r)), id=r["id"], ended_at=r["ended_at"],
                    ended_reason=r["ended_reason"])
