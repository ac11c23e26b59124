"""The evaluations table: each detector's latest verdict per series (no signal is also an answer,
with its reason)."""
from __future__ import annotations

from typing import Sequence

from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked
from daemon.storage.records import EvaluationRow, Verdict


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
    def record_many(self, verdicts: Sequence[Verdict]) -> None:
        """Many verdicts in one transaction: a poll cycle over thousands of series must not pay one
        fsync per series."""
        for v in verdicts:
            p, k, r = v.policy, v.series, v.reason
            # ASCII text is always storable: checked (which names the field) only where some is not.
            if not (isinstance(p, str) and isinstance(k, str) and isinstance(r, str)
                    and p.isascii() and k.isascii() and r.isascii()):
                checked(policy=p, series=k, reason=r)
        now = self._core.clock()
        self._core.write(lambda db: db.executemany(
            "INSERT INTO evaluations(policy, trigger_index, series, at, fired, reason) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(policy, trigger_index, series) DO UPDATE SET at=excluded.at,"
            " fired=excluded.fired, reason=excluded.reason",
            [(v.policy, v.trigger_index, v.series, now, int(v.fired), v.reason) for v in verdicts]))

    @blocking
    def all(self, policy: str | None = None) -> list[EvaluationRow]:
        """The latest verdicts (of one policy when given), by policy and series."""
        columns = "SELECT policy, trigger_index, series, at, fired, reason FROM evaluations"
        rows = (self._core.read(columns + " ORDER BY policy, series") if policy is None
                else self._core.read(columns + " WHERE policy=? ORDER BY series", (policy,)))
        return [EvaluationRow(r["policy"], int(r["trigger_index"]), r["series"], float(r["at"]), bool(r["fired"]),
                              r["reason"]) for r in rows]
