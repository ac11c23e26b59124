"""The decisions and steps tables: what each policy decided about each signal, the steps it took,
its recovery check and verdict, and the executed plans the guards count.

Every write of the acting path is fenced: by the core term (one leader), and with sharding on by the
term of the target's shard as well (`ShardTerms.fence_target`, in the write's own transaction), so a
replica that lost a shard (paused past its Lease, or handed it back) never journals over the
decision of the shard's new leader: its write raises ShardFenced, as the door's intent would."""
from __future__ import annotations

import json
from typing import Any, Callable

from core.decision import EXPIRED_KEY, DecisionState, read_state, stored_state
from daemon.storage.backend import Backend, Row
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked
from daemon.storage.cross_table import insert_freeze
from daemon.storage.records import (RECOVERY, CheckInFlight, Decision, ExecutedMark, FreezeRequest, GuardHistory,
                                    LatestDecision, OpenRecovery, RecoveryRow, StepRecord, StepRow)
from daemon.storage.step_kinds import UNSETTLED_VERDICTS, StepPhase, StepStatus


class Decisions:
    """The journal's decisions, with their steps."""

    def __init__(self, core: JournalCore, fence_target: Callable[[Backend, str], None] | None = None) -> None:
        self._core = core
        # The shard terms' check (`ShardTerms.fence_target`), passed in: the repositories stay independent.
        self._fence_target = fence_target

    def _fence(self, db: Backend, target: str | None) -> None:
        """Inside the write: refuse it (ShardFenced) unless this process holds the current term of
        `target`'s shard (sharding on); a decision not in the journal (None) has nothing to fence."""
        if self._fence_target is not None and target is not None:
            self._fence_target(db, target)

    def _fence_decision(self, db: Backend, decision_id: int) -> None:
        row = db.execute("SELECT target FROM decisions WHERE id=?", (decision_id,)).fetchone()
        self._fence(db, None if row is None else str(row["target"]))

    # ---- writes of the acting path (fenced) -----------------------------------------------------

    @blocking
    def record(self, signal_id: int, policy: str, target: str, state: DecisionState, reason: str,
               plan: dict[str, Any], executed: bool) -> int:
        """The decision of `policy` on the signal (one per signal and policy: recording it again
        updates it); its id."""
        checked(policy=policy, target=target, state=state, reason=reason)
        core = self._core

        def run(db: Backend) -> int:
            # The claim: which replica, in which term, decided (a new leader resuming it claims it anew).
            self._fence(db, target)
            fence = core.fence
            holder, term = (None, None) if fence is None else (fence.holder, fence.term)
            row = db.execute(
                "INSERT INTO decisions(signal_id, policy, target, at, state, reason, plan, executed, holder, term)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(signal_id, policy) DO UPDATE SET state=excluded.state,"
                " reason=excluded.reason, plan=excluded.plan, executed=CASE WHEN excluded.executed > decisions.executed"
                " THEN excluded.executed ELSE decisions.executed END, holder=excluded.holder, term=excluded.term"
                " RETURNING id",
                (signal_id, policy, target, self._core.clock(), state, reason, json.dumps(plan), int(executed), holder, term),
            ).fetchone()
            return int(row["id"])

        return core.fenced_write(run)

    @blocking
    def finish(self, decision_id: int, state: DecisionState, reason: str,
               recovery: CheckInFlight | None = None, expired: dict[str, Any] | None = None) -> None:
        """Set the decision's final state; with `recovery`, its recovery check is journaled as in
        flight (a pending recovery row) in the same transaction. EXPIRED needs
        `expired` (why, age): stored as failed with it in the plan (`core.decision.stored_state`)."""
        checked(state=state, reason=reason)
        if (state is DecisionState.EXPIRED) != (expired is not None):
            raise ValueError("an expired decision, and only one, says why it expired")

        def run(db: Backend) -> None:
            self._fence_decision(db, decision_id)
            if expired is not None:
                row = db.execute("SELECT plan FROM decisions WHERE id=?", (decision_id,)).fetchone()
                plan = {**(json.loads(row["plan"]) if row is not None else {}), EXPIRED_KEY: expired}
                db.execute("UPDATE decisions SET state=?, reason=?, plan=? WHERE id=?",
                           (stored_state(state), reason, json.dumps(plan, default=str), decision_id))
            else:
                db.execute("UPDATE decisions SET state=?, reason=? WHERE id=?", (state, reason, decision_id))
            if recovery is not None:
                _insert_step(db, _recovery_row(decision_id, StepStatus.PENDING, recovery.message, recovery.data),
                             self._core.clock())

        self._core.fenced_write(run)

    @blocking
    def record_step(self, step: StepRecord) -> None:
        def run(db: Backend) -> None:
            self._fence_decision(db, step.decision_id)
            _insert_step(db, step, self._core.clock())

        self._core.fenced_write(run)

    @blocking
    def record_verdict(self, decision_id: int, status: StepStatus, message: str, data: dict[str, Any],
                       freeze: FreezeRequest | None = None) -> int | None:
        """The recovery verdict (a recovery row with `status`), and with `freeze` the target's freeze
        that escalates it, in one transaction. Returns the freeze's id."""
        if freeze is not None:
            checked(target=freeze.target, reason=freeze.reason)

        def run(db: Backend) -> int | None:
            self._fence_decision(db, decision_id)
            _insert_step(db, _recovery_row(decision_id, status, message, data), self._core.clock())
            if freeze is None:
                return None
            return insert_freeze(db, freeze.target, freeze.reason, freeze.until, decision_id, at=self._core.clock())

        return self._core.fenced_write(run)

    # ---- reads ----------------------------------------------------------------------------------

    @blocking
    def get(self, decision_id: int) -> Decision | None:
        rows = self._core.read("SELECT * FROM decisions WHERE id=?", (decision_id,))
        return decision_from_row(rows[0]) if rows else None

    @blocking
    def for_signal(self, signal_id: int, policy: str) -> Decision | None:
        """The decision of `policy` on the signal, if it made one."""
        rows = self._core.read("SELECT * FROM decisions WHERE signal_id=? AND policy=?", (signal_id, policy))
        return decision_from_row(rows[0]) if rows else None

    @blocking
    def unfinished_for_signal(self, signal_id: int) -> list[Decision]:
        """The signal's decisions still `executing` (whatever policy made them), in id order."""
        rows = self._core.read("SELECT * FROM decisions WHERE signal_id=? AND state=? ORDER BY id",
                               (signal_id, DecisionState.EXECUTING.value))
        return [decision_from_row(r) for r in rows]

    @blocking
    def all(self, policy: str | None = None) -> list[Decision]:
        """Every decision (of one policy when given), in id order."""
        if policy is None:
            rows = self._core.read("SELECT * FROM decisions ORDER BY id")
        else:
            rows = self._core.read("SELECT * FROM decisions WHERE policy=? ORDER BY id", (policy,))
        return [decision_from_row(r) for r in rows]

    @blocking
    def steps(self, decision_id: int) -> list[StepRow]:
        """The decision's step rows, their data decoded, in order."""
        rows = self._core.read("SELECT * FROM steps WHERE decision_id=? ORDER BY id", (decision_id,))
        return [StepRow(r["id"], r["decision_id"], r["idx"], r["action"], StepPhase(r["phase"]),
                        StepStatus(r["status"]), r["message"], json.loads(r["data"]), r["at"], r["duration_seconds"])
                for r in rows]

    @blocking
    def open_recoveries(self) -> list[OpenRecovery]:
        """Decisions whose recovery is unsettled (what a restart resumes), oldest first: the last
        recovery row is pending, or it is a verdict whose follow-up revert has not finished the
        decision (still `succeeded`)."""
        rows = self._core.read(
            "SELECT d.*, s.id AS row_id, s.status AS row_status, s.message AS row_message, s.data AS row_data,"
            " s.at AS row_at FROM decisions d JOIN steps s ON s.decision_id = d.id"
            " WHERE s.phase = ? AND s.id = (SELECT MAX(id) FROM steps WHERE decision_id = d.id AND phase = ?)"
            " AND (s.status = ? OR (d.state = ? AND " + self._core.sql.json_text("s.data", "follow_up")
            + " = 'revert' AND s.status IN (?, ?))) ORDER BY d.id",
            (StepPhase.RECOVERY.value, StepPhase.RECOVERY.value, StepStatus.PENDING.value,
             DecisionState.SUCCEEDED.value, *(v.value for v in UNSETTLED_VERDICTS)))
        return [OpenRecovery(decision_from_row(r), RecoveryRow(r["row_id"], StepStatus(r["row_status"]),
                                                               r["row_message"], json.loads(r["row_data"]), r["row_at"]))
                for r in rows]

    @blocking
    def latest(self) -> list[LatestDecision]:
        """The latest decision of every (policy, target), with the signal it answered (operator status)."""
        expired = self._core.sql.json_text("d.plan", EXPIRED_KEY)
        rows = self._core.read(
            "SELECT d.id, d.policy, d.target, d.at,"
            f" CASE WHEN d.state = 'failed' AND {expired} IS NOT NULL THEN 'expired' ELSE d.state END AS state,"
            " d.reason, s.name AS signal_name,"
            " s.source AS signal_source, s.received_at AS signal_at FROM decisions d"
            " JOIN signals s ON s.id = d.signal_id"
            " WHERE d.id IN (SELECT MAX(id) FROM decisions GROUP BY policy, target) ORDER BY d.target, d.policy")
        return [LatestDecision(r["id"], r["policy"], r["target"], r["at"], r["state"], r["reason"], r["signal_name"],
                               r["signal_source"], r["signal_at"]) for r in rows]

    # ---- executed plans (guards), local and imported (guard_marks) -------------------------------

    @blocking
    def guard_history(self, policy: str, target: str, window_seconds: float,
                      now: float | None = None) -> GuardHistory:
        """(time of the last executed plan, executed plans within the window)."""
        now = self._core.clock() if now is None else now
        # UNION (not UNION ALL): a mark this journal exported and imported back is one plan.
        rows = self._core.read(
            "SELECT MAX(at) AS last, SUM(CASE WHEN at > ? THEN 1 ELSE 0 END) AS n FROM ("
            " SELECT at FROM decisions WHERE policy=? AND target=? AND executed=1"
            " UNION SELECT at FROM guard_marks WHERE policy=? AND target=?) AS plans",
            (now - window_seconds, policy, target, policy, target),
        )
        last = rows[0]["last"]
        return GuardHistory(None if last is None else float(last), int(rows[0]["n"] or 0))

    @blocking
    def executed_marks(self, since: float) -> list[ExecutedMark]:
        """(policy, target, at) of every executed plan after `since`, local or imported."""
        rows = self._core.read(
            "SELECT policy, target, at FROM decisions WHERE executed=1 AND at > ?"
            " UNION SELECT policy, target, at FROM guard_marks WHERE at > ? ORDER BY policy, target, at",
            (since, since))
        return [ExecutedMark(r["policy"], r["target"], float(r["at"])) for r in rows]


def _recovery_row(decision_id: int, status: StepStatus, message: str, data: dict[str, Any]) -> StepRecord:
    """A recovery row of the decision: its check in flight (pending), or the verdict."""
    return StepRecord(decision_id, -1, RECOVERY, StepPhase.RECOVERY, status, message, data)


def _insert_step(db: Backend, step: StepRecord, at: float) -> None:
    # Stored as the enums' plain values: the rows are byte for byte what earlier releases wrote.
    phase, status = StepPhase(step.phase).value, StepStatus(step.status).value
    checked(action=step.action, phase=phase, status=status, message=step.message)
    db.execute(
        "INSERT INTO steps(decision_id, idx, action, phase, status, message, data, at, duration_seconds)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (step.decision_id, step.idx, step.action, phase, status, step.message, json.dumps(step.data, default=str),
         at, step.duration_seconds))


def decision_from_row(r: Row) -> Decision:
    plan = json.loads(r["plan"])
    return Decision(r["id"], r["signal_id"], r["policy"], r["target"], r["at"], read_state(r["state"], plan),
                    r["reason"], plan, bool(r["executed"]))
