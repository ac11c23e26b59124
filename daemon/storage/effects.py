"""The effects table: every write to the world the door (daemon/workers/door.py) let through or
refused, its intent before the call and its result after, and the pin reconciler's re-pin and
escalation marks (the tug of war with a deploy pipeline, counted per target)."""
from __future__ import annotations

import json
from typing import Any, Callable

from daemon.storage.backend import Backend
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked, decode_payload
from daemon.storage.records import EffectRow

INTENT = "intent"
DONE = "done"
FAILED = "failed"
REFUSED = "refused"


class Effects:
    """The journal's effects."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    @blocking
    def record(self, writer: str, target: str, kind: str, status: str, message: str, data: dict[str, Any],
               decision_id: int | None = None, *, fenced: bool = False,
               also_check: Callable[[], None] | None = None) -> int:
        """One effect row; its id. `fenced`: refused (JournalFenced) when another replica took a newer
        term: an intent journaled fenced is the fence check of the write it announces. `also_check`
        runs first inside the same transaction and may refuse it too (a shard's term: ShardTerms.check)."""
        checked(writer=writer, target=target, kind=kind, status=status, message=message)
        core = self._core

        def run(db: Backend) -> int:
            if also_check is not None:
                also_check()
            term = core.fence.term if core.fence is not None else None
            row = db.execute(
                "INSERT INTO effects(at, writer, target, kind, status, message, data, term, decision_id)"
                " VALUES (?,?,?,?,?,?,?,?,?) RETURNING id",
                (core.clock(), writer, target, kind, status, message, json.dumps(data, default=str), term,
                 decision_id)).fetchone()
            return int(row["id"])

        return (core.fenced_write if fenced else core.write)(run)

    @blocking
    def of(self, target: str | None = None, kind: str | None = None, since: float | None = None
           ) -> list[EffectRow]:
        """Effect rows (of one target, one kind, since a time when given), oldest first."""
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("target", target), ("kind", kind)):
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        if since is not None:
            where.append("at>=?")
            params.append(since)
        sql = ("SELECT id, at, writer, target, kind, status, message, data, term, decision_id FROM effects"
               + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY id")
        return [EffectRow(int(r["id"]), float(r["at"]), r["writer"], r["target"], r["kind"], r["status"], r["message"],
                          decode_payload(r["data"]), None if r["term"] is None else int(r["term"]),
                          None if r["decision_id"] is None else int(r["decision_id"]))
                for r in self._core.read(sql, params)]

    @blocking
    def count(self, target: str, kind: str, status: str, since: float) -> int:
        """How many rows of `kind` with `status` `target` has since `since`."""
        rows = self._core.read("SELECT COUNT(*) AS n FROM effects WHERE target=? AND kind=? AND status=? AND at>=?",
                               (target, kind, status, since))
        return int(rows[0]["n"])
