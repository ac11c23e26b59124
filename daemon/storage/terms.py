"""The leadership table: the term (fencing token) handed to the replica that took over last."""
from __future__ import annotations

from daemon.storage.backend import Backend
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked
from daemon.storage.records import Term


class Terms:
    """The journal's leadership terms; the core checks fenced writes against the term taken last."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    @blocking
    def take(self, holder: str, lease_transitions: int | None = None) -> Term:
        """Take the next term for `holder` (the replica that just acquired the Lease): from now on
        fenced writes of any process holding an older term are refused. Returns the new term."""
        checked(holder=holder)
        now = self._core.clock()

        def run(db: Backend) -> Term:
            row = db.execute(
                "INSERT INTO leadership(id, term, holder, lease_transitions, since) VALUES (1, 1, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET term=leadership.term + 1, holder=excluded.holder,"
                " lease_transitions=excluded.lease_transitions, since=excluded.since RETURNING term",
                (holder, lease_transitions, now)).fetchone()
            return Term(int(row["term"]), holder, now, lease_transitions)

        return self._core.write(run, after_commit=self._core.hold)

    @blocking
    def current(self) -> Term | None:
        """The journal's term now: the replica that took over last."""
        rows = self._core.read("SELECT term, holder, since, lease_transitions FROM leadership WHERE id=1")
        if not rows:
            return None
        r = rows[0]
        transitions = r["lease_transitions"]
        return Term(int(r["term"]), str(r["holder"]), float(r["since"]),
                    None if transitions is None else int(transitions))
