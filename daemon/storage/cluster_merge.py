"""What a journal shares with the other replicas' journals through the cluster state
(daemon/cluster/cluster_state.py), and the merge of what another leader shared, across the pins,
guard marks, bad-version and freeze tables in one transaction."""
from __future__ import annotations

from typing import Iterable

from daemon.storage.blocking import blocking
from daemon.storage.backend import Backend
from daemon.storage.core import JournalCore, checked
from daemon.storage.cross_table import insert_ended, pin_from_row
from daemon.storage.records import (BadClear, BadMark, ExecutedMark, FreezeMark, Lift, MergeCounts, Pin, PinEnd,
                                    SharedState)


class ClusterMerge:
    """The journal's side of the cluster state: export (shared_state) and import (merge)."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    @blocking
    def shared_state(self, since: float, now: float | None = None) -> SharedState:
        """What the cluster state shares besides live pins and guard marks: the newest pin end per
        target, bad-version marks in force and their clears, freezes in force and their lifts.
        Ends, clears and lifts are kept when they happened after `since` (a lift also while a freeze
        it lifted would still be in force at `now`)."""
        now = self._core.clock() if now is None else now
        read = self._core.read
        ends: dict[str, PinEnd] = {}
        for r in read("SELECT target, at, ended_at, ended_reason FROM pin_history WHERE ended_at > ?"
                      " ORDER BY target, at, ended_at", (since,)):
            ends[r["target"]] = PinEnd(target=r["target"], at=float(r["at"]), ended_at=float(r["ended_at"]),
                                       reason=r["ended_reason"])
        marks: dict[tuple[str, int], BadMark] = {}
        for r in read("SELECT target, version, reason, at FROM bad_versions WHERE cleared_at IS NULL"
                      " ORDER BY at, id"):
            marks[(r["target"], int(r["version"]))] = BadMark(target=r["target"], version=int(r["version"]),
                                                              reason=r["reason"], at=float(r["at"]))
        clears: dict[tuple[str, int], BadClear] = {}
        for r in read("SELECT target, version, cleared_at, cleared_reason FROM bad_versions"
                      " WHERE cleared_at > ? ORDER BY cleared_at, id", (since,)):
            clears[(r["target"], int(r["version"]))] = BadClear(target=r["target"], version=int(r["version"]),
                                                                at=float(r["cleared_at"]),
                                                                reason=r["cleared_reason"] or "")
        freezes = tuple(FreezeMark(target=r["target"], reason=r["reason"], at=float(r["at"]), until=float(r["until"]))
                        for r in read("SELECT target, reason, at, until FROM freezes WHERE lifted_at IS NULL"
                                      " AND until > ? ORDER BY target, at", (now,)))
        lifts: dict[str, Lift] = {}
        for r in read("SELECT target, lifted_at, lifted_reason, until FROM freezes WHERE lifted_at IS NOT NULL"
                      " ORDER BY lifted_at, id"):
            prev = lifts.get(r["target"])
            until = max(float(r["until"]), prev.until if prev else float("-inf"))
            lifts[r["target"]] = Lift(target=r["target"], at=float(r["lifted_at"]), reason=r["lifted_reason"] or "",
                                      until=until)
        return SharedState(pin_ends=tuple(ends.values()), bad_marks=tuple(marks.values()),
                           bad_clears=tuple(clears.values()), freezes=freezes,
                           lifts=tuple(lift for lift in lifts.values() if lift.at > since or lift.until > now))

    @blocking
    def merge(self, pins: Iterable[Pin], marks: Iterable[ExecutedMark], since: float,
              shared: SharedState | None = None, now: float | None = None) -> MergeCounts:
        """Import what another leader recorded, in one transaction. Idempotent: importing the same
        state again changes nothing.

        Args:
            pins: live pins (their target, model, version and `at` are imported); the newer `at` wins
                over a local pin, and a known end (shared or in pin_history) with the same or a newer
                pin `at` wins over the pin.
            marks: executed plans, counted by guard_history from now on.
            since: imported marks at or before this are dropped (they can no longer block anything).
            shared: pin ends (a live local pin they cover moves to pin_history), bad-version marks
                and clears (a clear covers the marks of its version made at or before it), freezes
                and lifts (a lift covers the target's freezes made at or before it); see SharedState.
            now: freezes that ended by then are not imported.

        Returns:
            How many pins were inserted, replaced or ended; marks added; bad-version, freeze rows
            added or updated.
        """
        pin_rows, mark_rows = list(pins), list(marks)
        extra = shared or SharedState()
        now = self._core.clock() if now is None else now
        for pin in pin_rows:
            checked(target=pin.target, model=pin.model)
        for executed in mark_rows:
            checked(policy=executed.policy, target=executed.target)
        for texts in (extra.pin_ends, extra.bad_marks, extra.bad_clears, extra.freezes, extra.lifts):
            for entry in texts:
                checked(target=entry.target, reason=entry.reason)
        ended_at: dict[str, float] = {}
        for end in extra.pin_ends:
            ended_at[end.target] = max(float(end.at), ended_at.get(end.target, float("-inf")))
        cleared_at: dict[tuple[str, int], float] = {}
        for clear in extra.bad_clears:
            key = (clear.target, int(clear.version))
            cleared_at[key] = max(float(clear.at), cleared_at.get(key, float("-inf")))
        lifted_at: dict[str, float] = {}
        for lift in extra.lifts:
            lifted_at[lift.target] = max(float(lift.at), lifted_at.get(lift.target, float("-inf")))

        def run(db: Backend) -> MergeCounts:
            changed = added = other = 0
            for end in extra.pin_ends:
                row = db.execute("SELECT * FROM pins WHERE target=? AND at<=?", (end.target, float(end.at))).fetchone()
                if row is not None:
                    insert_ended(db, pin_from_row(row), float(end.ended_at), end.reason)
                    changed += db.execute("DELETE FROM pins WHERE target=?", (end.target,)).rowcount
            for pin in pin_rows:
                if float(pin.at) <= ended_at.get(pin.target, float("-inf")) or db.execute(
                        "SELECT 1 FROM pin_history WHERE target=? AND at>=?", (pin.target, float(pin.at))).fetchone():
                    continue  # that pin (or a newer one) is known to have ended
                changed += db.execute(
                    "INSERT INTO pins(target, model, version, at) VALUES (?,?,?,?)"
                    " ON CONFLICT(target) DO UPDATE SET model=excluded.model, version=excluded.version,"
                    " at=excluded.at WHERE excluded.at > pins.at",
                    (pin.target, pin.model, int(pin.version), float(pin.at))).rowcount
            for executed in mark_rows:
                if executed.at > since:
                    added += db.execute(
                        "INSERT INTO guard_marks(policy, target, at) VALUES (?,?,?) ON CONFLICT DO NOTHING",
                        (executed.policy, executed.target, float(executed.at))).rowcount
            db.execute("DELETE FROM guard_marks WHERE at <= ?", (since,))
            for clear in extra.bad_clears:
                other += db.execute(
                    "UPDATE bad_versions SET cleared_at=?, cleared_reason=? WHERE target=? AND version=?"
                    " AND cleared_at IS NULL AND at <= ?",
                    (float(clear.at), clear.reason, clear.target, int(clear.version), float(clear.at))).rowcount
            for mark in extra.bad_marks:
                if float(mark.at) <= cleared_at.get((mark.target, int(mark.version)), float("-inf")):
                    continue
                if db.execute("SELECT 1 FROM bad_versions WHERE target=? AND version=?"
                              " AND (cleared_at IS NULL OR cleared_at >= ?)",
                              (mark.target, int(mark.version), float(mark.at))).fetchone() is None:
                    other += db.execute("INSERT INTO bad_versions(target, version, reason, at) VALUES (?,?,?,?)",
                                        (mark.target, int(mark.version), mark.reason, float(mark.at))).rowcount
            for lift in extra.lifts:
                other += db.execute(
                    "UPDATE freezes SET lifted_at=?, lifted_reason=? WHERE target=? AND lifted_at IS NULL"
                    " AND at <= ? AND until > ?",
                    (float(lift.at), lift.reason, lift.target, float(lift.at), float(lift.at))).rowcount
            for freeze in extra.freezes:
                if float(freeze.until) <= now or float(freeze.at) <= lifted_at.get(freeze.target, float("-inf")):
                    continue
                if db.execute("SELECT 1 FROM freezes WHERE target=? AND (at=? OR lifted_at >= ?)",
                              (freeze.target, float(freeze.at), float(freeze.at))).fetchone() is None:
                    other += db.execute("INSERT INTO freezes(target, reason, at, until) VALUES (?,?,?,?)",
                                        (freeze.target, freeze.reason, float(freeze.at), float(freeze.until))).rowcount
            return MergeCounts(changed, added, other)

        return self._core.write(run)
