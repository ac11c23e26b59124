"""The journal bounded in size as well as age: past `max_rows` decisions (or signals, or the door's
effects), the oldest settled ones go first, inside the caller's transaction (`Journal.prune_to_size`).

What is never pruned here: pending signals, and signals a kept decision answers; decisions still
`executing`, with an approval pending, or with a recovery unsettled (the last recovery row pending,
or a verdict whose revert has not finished the decision: what `Decisions.open_recoveries` resumes);
executed decisions and signals newer than `keep_after` (the guards' windows count them: cooldown,
maxActions, the target budget, common cause). Effects newer than `keep_after` (no intent is pruned
while its write may be in flight: a write's timeout is far below the guards' windows, and an intent
goes no later than its result, oldest first), an escalated tug of war (it holds its pin until an
operator answers), and the re-pins of a live pin (counted over executor.repinWindowSeconds, which is
not among the guards' windows). Pins, pin history, freezes, bad marks and guard marks live in tables
this never touches.
"""
from __future__ import annotations

from daemon.storage.backend import Backend
from daemon.storage.step_kinds import UNSETTLED_VERDICTS, StepPhase, StepStatus

_VERDICTS = ", ".join(f"'{v.value}'" for v in UNSETTLED_VERDICTS)
UNSETTLED = (
    "SELECT id FROM decisions WHERE state = 'executing'"
    " UNION SELECT decision_id FROM approvals WHERE status = 'pending'"
    " UNION SELECT d.id FROM decisions d JOIN steps s ON s.decision_id = d.id"
    f" WHERE s.phase = '{StepPhase.RECOVERY.value}' AND s.id = (SELECT MAX(id) FROM steps WHERE decision_id = d.id"
    f" AND phase = '{StepPhase.RECOVERY.value}') AND (s.status = '{StepStatus.PENDING.value}'"
    " OR (d.state = 'succeeded' AND {follow_up} = 'revert'"
    f" AND s.status IN ({_VERDICTS})))"
)


def prune_history(db: Backend, max_rows: int, keep_after: float) -> dict[str, int]:
    """Delete the oldest prunable decisions (with their steps and settled approvals) past `max_rows`
    decisions, then the oldest processed signals no decision answers past `max_rows` signals, then
    the oldest prunable effects past `max_rows` effects.
    Returns the rows deleted per table. Raises ValueError for `max_rows` < 1."""
    if max_rows < 1:
        raise ValueError("max_rows must be at least 1")
    deleted = {"decisions": 0, "steps": 0, "signals": 0, "effects": 0}
    excess = _count(db, "SELECT COUNT(*) AS n FROM decisions") - max_rows
    if excess > 0:
        unsettled = UNSETTLED.format(follow_up=db.json_text("s.data", "follow_up"))
        rows = db.execute(
            f"SELECT id FROM decisions WHERE id NOT IN ({unsettled}) AND NOT (executed = 1 AND at > ?)"
            " ORDER BY at, id LIMIT ?", (keep_after, excess)).fetchall()
        ids = [int(r["id"]) for r in rows]
        for chunk in _chunks(ids):
            marks = ", ".join("?" * len(chunk))
            deleted["steps"] += db.execute(f"DELETE FROM steps WHERE decision_id IN ({marks})", chunk).rowcount
            db.execute(f"DELETE FROM approvals WHERE decision_id IN ({marks})", chunk)
            deleted["decisions"] += db.execute(f"DELETE FROM decisions WHERE id IN ({marks})", chunk).rowcount
    excess = _count(db, "SELECT COUNT(*) AS n FROM signals") - max_rows
    if excess > 0:
        rows = db.execute(
            "SELECT id FROM signals WHERE state = 'processed' AND received_at <= ?"
            " AND id NOT IN (SELECT signal_id FROM decisions) ORDER BY received_at, id LIMIT ?",
            (keep_after, excess)).fetchall()
        for chunk in _chunks([int(r["id"]) for r in rows]):
            marks = ", ".join("?" * len(chunk))
            deleted["signals"] += db.execute(f"DELETE FROM signals WHERE id IN ({marks})", chunk).rowcount
    excess = _count(db, "SELECT COUNT(*) AS n FROM effects") - max_rows
    if excess > 0:
        rows = db.execute(
            "SELECT id FROM effects WHERE at <= ? AND kind != 'pin.escalated'"
            " AND NOT (kind = 'pin.repin' AND target IN (SELECT target FROM pins)) ORDER BY id LIMIT ?",
            (keep_after, excess)).fetchall()
        for chunk in _chunks([int(r["id"]) for r in rows]):
            marks = ", ".join("?" * len(chunk))
            deleted["effects"] += db.execute(f"DELETE FROM effects WHERE id IN ({marks})", chunk).rowcount
    return deleted


def _count(db: Backend, sql: str) -> int:
    # Reads inside the transaction (execute), not db.query: they must see this prune's own deletes.
    return int(db.execute(sql).fetchone()["n"])


def _chunks(ids: list[int], size: int = 500) -> list[list[int]]:
    """Bounded IN lists (SQLite's variable limit, PostgreSQL's statement size)."""
    return [ids[i:i + size] for i in range(0, len(ids), size)]
