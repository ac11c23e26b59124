"""The bad_versions table: versions of a target rolled back from (or marked by hand), which
`to: previous` skips until they are cleared."""
from __future__ import annotations

from daemon.storage.backend import Row
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked
from daemon.storage.cross_table import insert_mark
from daemon.storage.records import BadVersionMark


class BadVersions:
    """The journal's bad-version marks."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    @blocking
    def mark(self, target: str, version: int, reason: str, decision_id: int | None = None) -> bool:
        """Mark `version` bad for `target` (kept once while not cleared); whether a mark was added
        (False: one is in force already)."""
        checked(target=target, reason=reason)
        return self._core.fenced_write(
            lambda db: insert_mark(db, target, int(version), reason, decision_id, self._core.clock()))

    @blocking
    def of(self, target: str, include_cleared: bool = False) -> list[BadVersionMark]:
        """The bad-version marks of `target` (only those in force unless `include_cleared`), oldest first."""
        where = "" if include_cleared else " AND cleared_at IS NULL"
        return [mark_from_row(r) for r in self._core.read(f"SELECT * FROM bad_versions WHERE target=?{where}"
                                                          " ORDER BY id", (target,))]

    @blocking
    def known(self, target: str) -> frozenset[int]:
        """The versions of `target` marked bad and not cleared."""
        return frozenset(int(r["version"]) for r in self._core.read(
            "SELECT version FROM bad_versions WHERE target=? AND cleared_at IS NULL", (target,)))

    @blocking
    def clear(self, target: str, version: int, reason: str) -> int:
        """Clear the mark on `version` of `target` (journaled with `reason`); how many were cleared."""
        checked(target=target, reason=reason)
        return self._core.write(lambda db: db.execute(
            "UPDATE bad_versions SET cleared_at=?, cleared_reason=? WHERE target=? AND version=?"
            " AND cleared_at IS NULL", (self._core.clock(), reason, target, int(version))).rowcount)


def mark_from_row(r: Row) -> BadVersionMark:
    return BadVersionMark(r["id"], r["target"], r["version"], r["reason"], r["decision_id"], r["at"],
                          r["cleared_at"], r["cleared_reason"])
