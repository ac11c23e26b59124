"""The evaluations table: each detector's latest verdict per series (no signal is also an answer,
with its reason)."""
from __future__ import annotations

from typing import Any, Sequence

from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked


class Evaluations:
    """The journal's evaluations."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    @blocking
    def record(self, policy: str, trigger_index: int, series: str, fired: bool, reason: str) -> None:
        """The latest verdict per series (no signal is also an answer, with its reason)."""
        checked(policy=policy, series=series, reason=reason)
        self._core.write(lambda db: db.execute(
            "INSERT INTO evaluations(policy, trigger_index, series, at, fired, reason) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(policy, trigger_index, series) DO UPDATE SET at=excluded.at,"
            " fired=excluded.fired, reason=excluded.reason",
            (policy, trigger_index, series, self._core.clock(), int(fired), reason)))

    @blocking
    def record_many(self, rows: Sequence[tuple[str, int, str, bool, str]]) -> None:
        """Many verdicts (policy, trigger index, series, fired, reason) in one transaction:
        a poll cycle over thousands of series must not pay one fsync per series."""
        for p, _, k, _, r in rows:
            # ASCII text is always storable: checked (which names the field) only where some is not.
            if not (isinstance(p, str) and isinstance(k, str) and isinstance(r, str)
                    and p.isascii() and k.isascii() and r.isascii()):
                checked(policy=p, series=k, reason=r)
        now = self._core.clock()
        self._core.write(lambda db: db.executemany(
            "INSERT INTO evaluations(policy, trigger_index, series, at, fired, reason) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(policy, trigger_index, series) DO UPDATE SET at=excluded.at,"
            " fired=excluded.fired, reason=excluded.reason",
            [(p, i, k, now, int(f), r) for p, i, k, f, r in rows]))

    @blocking
    def all(self, policy: str | None = None) -> list[dict[str, Any]]:
        """The latest verdicts (of one policy when given), by policy and series."""
        if policy is None:
            return [dict(r) for r in self._core.read("SELECT * FROM evaluations ORDER BY policy, series")]
        return [dict(r) for r in self._core.read("SELECT * FROM evaluations WHERE policy=? ORDER BY series",
                                                 (policy,))]
