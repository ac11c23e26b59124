"""The approvals table: plans of policies with `approval: required`, waiting for an operator until
their deadline, and what became of them (each with its decision, kept in step)."""
from __future__ import annotations

import json
from typing import Any

from core.timestamps import iso_utc
from core.decision import DecisionState
from daemon.storage.backend import Backend, Row
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked
from daemon.storage.records import Approval


class Approvals:
    """The journal's approvals."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    @blocking
    def request(self, signal_id: int, policy: str, target: str, plan: dict[str, Any],
                deadline: float) -> Approval:
        """Journal a plan that waits for an operator: its decision (blocked, "awaiting approval N")
        and the approval, in one transaction. An approved plan's decision turns `executing` (approve)."""
        checked(policy=policy, target=target)

        def run(db: Backend) -> Approval:
            now = self._core.clock()
            db.execute(
                "INSERT INTO decisions(signal_id, policy, target, at, state, reason, plan, executed)"
                " VALUES (?, ?, ?, ?, ?, '', ?, 0)",
                (signal_id, policy, target, now, DecisionState.BLOCKED.value, json.dumps(plan)))
            decision_id = int(db.execute("SELECT id FROM decisions WHERE signal_id=? AND policy=?",
                                         (signal_id, policy)).fetchone()["id"])
            approval_id = int(db.execute(
                "INSERT INTO approvals(decision_id, policy, target, requested_at, deadline)"
                " VALUES (?,?,?,?,?) RETURNING id", (decision_id, policy, target, now, deadline)).fetchone()["id"])
            db.execute("UPDATE decisions SET reason=? WHERE id=?",
                       (f"awaiting approval {approval_id} until {iso_utc(deadline)}", decision_id))
            return Approval(approval_id, decision_id, policy, target, now, deadline, "pending")

        return self._core.fenced_write(run)

    @blocking
    def get(self, approval_id: int) -> Approval | None:
        rows = self._core.read("SELECT * FROM approvals WHERE id=?", (approval_id,))
        return approval_from_row(rows[0]) if rows else None

    @blocking
    def all(self, status: str | None = None) -> list[Approval]:
        """Approvals (of one status when given), oldest first."""
        if status is None:
            return [approval_from_row(r) for r in self._core.read("SELECT * FROM approvals ORDER BY id")]
        return [approval_from_row(r) for r in self._core.read("SELECT * FROM approvals WHERE status=? ORDER BY id",
                                                              (status,))]

    @blocking
    def pending_for(self, policy: str, target: str) -> Approval | None:
        """The oldest approval of `policy` on `target` still pending."""
        rows = self._core.read("SELECT * FROM approvals WHERE status='pending' AND policy=? AND target=?"
                               " ORDER BY id LIMIT 1", (policy, target))
        return approval_from_row(rows[0]) if rows else None

    @blocking
    def approve(self, approval_id: int, by: str, reason: str, now: float | None = None) -> Approval | None:
        """Approve a pending approval before its deadline: its decision turns `executing`, executed
        (it counts for cooldown and rate limit from now). None when it is not pending (or past its deadline)."""
        checked(by=by, reason=reason)
        at = self._core.clock() if now is None else now

        def run(db: Backend) -> Approval | None:
            row = db.execute(
                "UPDATE approvals SET status='approved', decided_at=?, decided_by=?, reason=? WHERE id=?"
                " AND status='pending' AND deadline > ? RETURNING *", (at, by, reason, approval_id, at)).fetchone()
            if row is None:
                return None
            approval = approval_from_row(row)
            db.execute("UPDATE decisions SET state=?, executed=1, at=?, reason=? WHERE id=?",
                       (DecisionState.EXECUTING.value, at, f"approved by {by}: {reason}; applying",
                        approval.decision_id))
            return approval

        return self._core.write(run)

    @blocking
    def expire(self, now: float | None = None) -> list[Approval]:
        """Expire the pending approvals whose deadline has passed; their decisions say so. The ones expired."""
        at = self._core.clock() if now is None else now

        def run(db: Backend) -> list[Approval]:
            rows = db.execute(
                "UPDATE approvals SET status='expired', decided_at=?, reason='deadline passed' WHERE status='pending'"
                " AND deadline <= ? RETURNING *", (at, at)).fetchall()
            expired = [approval_from_row(r) for r in rows]
            for a in expired:
                db.execute("UPDATE decisions SET reason=? WHERE id=?",
                           (f"approval {a.id} expired at {iso_utc(a.deadline)}; not applied", a.decision_id))
            return expired

        return self._core.fenced_write(run)


def approval_from_row(r: Row) -> Approval:
    return Approval(r["id"], r["decision_id"], r["policy"], r["target"], r["requested_at"], r["deadline"],
                    r["status"], r["decided_at"], r["decided_by"], r["reason"])
