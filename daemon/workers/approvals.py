"""Approvals: plans of policies with `approval: required` wait for an operator until a deadline.

`ApprovalGate` journals such a plan for the executor (decision `blocked`, "awaiting approval N") and
announces it; an operator approves it with `tailguard approve N` or `POST /api/v1/approvals/N/approve`
(a token with the `write` scope): `ApprovalGate.approve` answers an `ApprovalResult` (the HTTP layer
maps it to a status code) and applies the plan in a task of its own; `ApprovalExpiry` expires the
ones whose deadline passed and announces that. The notification carries the command and the call,
never a link that approves by itself.
"""
from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

import structlog

from core.timestamps import iso_utc
from core.decision import DecisionState
from core.signal import Signal
from daemon.common.lifecycle import Spawn, plain_spawn, wait_or_stop
from daemon.common.metrics import Metrics
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal
from daemon.storage.records import Approval
from daemon.workers.context import ActContext
from daemon.workers.progress import StepProgress, journaled_plan, policy_runs_plan, step_progress
from policies.guards import GuardDecision
from policies.loader import LoadedPolicy
from policies.planning import Plan

log = structlog.get_logger("tailguard.approvals")
executor_log = structlog.get_logger("tailguard.executor")  # the gate's lines are the executor's work

Notify = Callable[[Mapping[str, Any]], None]
BaseUrl = Callable[[], str]
"""How operators reach the API, read when a notification is made (the port is known once it listens)."""


def approval_instructions(approval_id: int, base_url: str) -> dict[str, str]:
    """How an operator approves: the CLI command and the authenticated API call (no link that acts)."""
    url = base_url.rstrip("/")
    return {
        "command": f"tailguard approve {approval_id} --url {url} --reason '...'",
        "call": (f"curl -X POST -H 'Authorization: Bearer <a token with the write scope>' "
                 f"-d '{{\"reason\": \"...\"}}' {url}/api/v1/approvals/{approval_id}/approve"),
    }


def approval_event(event: str, approval: Approval, base_url: str, message: str, **extra: Any) -> dict[str, Any]:
    """An approval notification: what waits (or waited), until when, and how to approve it."""
    return {"event": event, "policy": approval.policy, "target": approval.target, "message": message,
            "decision": approval.decision_id, "approval": approval.id, "deadline": iso_utc(approval.deadline),
            "at": iso_utc(time.time()), **approval_instructions(approval.id, base_url), **extra}


def approval_view(approval: Approval, now: float) -> dict[str, Any]:
    """An approval as the API and `tailguard status` show it."""
    return {"id": approval.id, "decision": approval.decision_id, "policy": approval.policy,
            "target": approval.target, "status": approval.status, "requestedAt": iso_utc(approval.requested_at),
            "deadline": iso_utc(approval.deadline), "secondsLeft": max(0.0, round(approval.deadline - now, 1))
            if approval.status == "pending" else None,
            "decidedAt": iso_utc(approval.decided_at) if approval.decided_at else None,
            "decidedBy": approval.decided_by, "reason": approval.reason}


def awaiting_reason(approval: Approval) -> str:
    """Why a new signal's decision is blocked while `approval` waits (one plan per policy and target)."""
    return f"awaiting approval {approval.id} (decision {approval.decision_id}) until {iso_utc(approval.deadline)}"


class ApprovalOutcome(enum.Enum):
    """What an approve call came to (daemon.http.api maps each to its HTTP status)."""

    STARTED = "started"  # approved: its plan is being applied
    NOT_FOUND = "not_found"  # no approval with that id
    NOT_PENDING = "not_pending"  # approved, expired or rejected already (or meanwhile)
    EXPIRED = "expired"  # past its deadline (ApprovalExpiry has not got to it yet)
    POLICY_CHANGED = "policy_changed"  # its policy is gone or now runs other actions: left unapplied
    FROZEN = "frozen"  # a freeze is in force: it stays pending (lift, then approve)


@dataclass(frozen=True)
class ApprovalResult:
    """The answer to an approve call: the outcome, one line for the operator, and the approval
    (None only when there is none)."""

    outcome: ApprovalOutcome
    message: str
    approval: Approval | None = None


FreezeCheck = Callable[[LoadedPolicy, float], Awaitable[GuardDecision | None]]
"""The runtime freeze in force on the daemon or the policy's target at a time (None: neither)."""
Finish = Callable[[int, LoadedPolicy, Plan, Mapping[int, StepProgress], Signal], Awaitable[None]]
"""Runs a decision's plan from its progress, then its recovery check; the caller holds the target lock."""


class ApprovalGate:
    """The executor's plans that wait for an operator: requested, approved and applied, resumed.

    Args:
        ctx: The executor's plumbing: the journal (approvals and their decisions), the state (an
            approved plan runs only if its policy still runs its actions; the global freeze), metrics
            (the decision counted blocked while it waits), the target locks, clock, on_recorded (an
            approval was journaled: cluster state).
        frozen: Approving waits out a runtime freeze (the approval stays pending).
        finish: Applies an approved plan (the executor's, as for any executed plan).
        send: Hands a notification over; never blocks, never fails the caller.
        base_url: Named in the notifications' command and call.
    """

    def __init__(self, ctx: ActContext, frozen: FreezeCheck, finish: Finish, send: Notify, base_url: BaseUrl) -> None:
        self._ctx = ctx
        self._frozen = frozen
        self._finish = finish
        self._send = send
        self._base_url = base_url
        self._running: set[asyncio.Task[None]] = set()  # approved plans being applied
        self.spawn: Spawn = plain_spawn  # the service hands the supervisor's: a crash is counted and logged
        # Sharding: whether this replica leads a target's shard; `resume` takes only those (the shard's
        # leader resumes the others, at its takeover or when it gains the shard).
        self.owns: Callable[[str], bool] | None = None
        self._resuming = asyncio.Lock()  # one resume at a time: a plan is started once

    async def request(self, signal_id: int, policy: LoadedPolicy, plan: Plan) -> Approval:
        """Journal the plan as waiting for an operator until the policy's deadline, and announce it."""
        deadline = self._ctx.clock() + policy.spec.approval_timeout_seconds
        approval = await self._ctx.journal.approvals.request.in_thread(signal_id, policy.name, policy.target.key,
                                                                       plan.as_dict(), deadline)
        self._ctx.metrics.decisions.labels(policy.name, DecisionState.BLOCKED).inc()
        executor_log.info("plan awaits approval", approval=approval.id, decision=approval.decision_id,
                          deadline=iso_utc(deadline), plan=[s.summary for s in plan.steps])
        summary = "; ".join(s.summary for s in plan.steps if not s.noop)
        self._send(approval_event("approval_requested", approval, self._base_url(),
                                  f"plan awaits approval {approval.id} until {iso_utc(deadline)}: {summary}"))
        return approval

    async def approve(self, approval_id: int, by: str, reason: str) -> ApprovalResult:
        """Approve a pending plan and start applying it (in the background): STARTED; else NOT_FOUND,
        NOT_PENDING, EXPIRED (past its deadline), POLICY_CHANGED (gone or running other actions) or
        FROZEN (a freeze in force: it stays pending)."""
        approval = await self._ctx.journal.approvals.get.in_thread(approval_id)
        if approval is None:
            return ApprovalResult(ApprovalOutcome.NOT_FOUND, f"no approval {approval_id}")
        if approval.status != "pending":
            by_whom = f" by {approval.decided_by}" if approval.decided_by else ""
            return ApprovalResult(ApprovalOutcome.NOT_PENDING,
                                  f"approval {approval_id} is {approval.status}{by_whom}, not pending", approval)
        now = self._ctx.clock()
        if approval.deadline <= now:
            return ApprovalResult(ApprovalOutcome.EXPIRED,
                                  f"approval {approval_id} passed its deadline {iso_utc(approval.deadline)}", approval)
        decision = await self._ctx.journal.decisions.get.in_thread(approval.decision_id)
        policy = self._policy(approval.policy)
        plan = journaled_plan(decision.plan) if decision is not None else None
        if decision is None or plan is None or not policy_runs_plan(policy, plan):
            return ApprovalResult(ApprovalOutcome.POLICY_CHANGED,
                                  f"approval {approval_id}: policy {approval.policy} is gone or now runs other "
                                  "actions; the plan is left unapplied", approval)
        async with self._ctx.lock_for(policy.target.key):
            frozen = (GuardDecision(False, "global freeze is on (config)") if self._ctx.state.frozen
                      else await self._frozen(policy, now))
            if frozen is not None:
                return ApprovalResult(ApprovalOutcome.FROZEN,
                                      f"approval {approval_id} stays pending: {frozen.reason}", approval)
            approved = await self._ctx.journal.approvals.approve.in_thread(approval_id, by, reason, now)
            if approved is None:  # expired or approved by someone else meanwhile
                return ApprovalResult(ApprovalOutcome.NOT_PENDING, f"approval {approval_id} is no longer pending",
                                      approval)
        self._ctx.on_recorded()
        executor_log.info("plan approved", approval=approval_id, by=by, reason=reason,
                          decision=approved.decision_id)
        self._send(approval_event("approved", approved, self._base_url(),
                                  f"approval {approval_id} approved by {by}: {reason}; applying", by=by))
        await self._start(approved, policy, plan, decision.signal_id, {})
        return ApprovalResult(ApprovalOutcome.STARTED,
                              f"approval {approval_id} approved by {by}; applying decision {approved.decision_id}",
                              approved)

    async def resume(self) -> int:
        """Go on with approved plans a restart interrupted (decision still `executing`); how many. One
        call at a time (a takeover and a shard gained may ask at once, and a start awaits the journal
        before its task is known): a plan is started once."""
        async with self._resuming:
            return await self._resume()

    async def _resume(self) -> int:
        started = 0
        for approval in await self._ctx.journal.approvals.all.in_thread("approved"):
            decision = await self._ctx.journal.decisions.get.in_thread(approval.decision_id)
            if decision is None or decision.state is not DecisionState.EXECUTING:
                continue
            if self.owns is not None and not self.owns(decision.target):
                continue
            if any(t.get_name() == _task_name(approval) for t in self._running):
                continue
            policy = self._policy(approval.policy)
            plan = journaled_plan(decision.plan)
            if not policy_runs_plan(policy, plan):
                await self._ctx.journal.decisions.finish.in_thread(
                    decision.id, DecisionState.FAILED, f"approved plan not resumed after restart: policy "
                                                       f"{approval.policy} is gone or now runs other actions")
                continue
            progress = step_progress(await self._ctx.journal.decisions.steps.in_thread(decision.id))
            await self._start(approval, policy, plan, decision.signal_id, progress)
            started += 1
        return started

    async def wait(self) -> None:
        """Wait until every approved plan being applied now has finished (tests, demo)."""
        while self._running:
            await asyncio.wait(set(self._running))

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the approved plans being applied (what they did not finish is resumed at the next
        start); the tasks, to be awaited."""
        running = list(self._running)
        for task in running:
            task.cancel()
        self._running.clear()
        return running

    def _policy(self, name: str) -> LoadedPolicy | None:
        return next((p for p in self._ctx.state.policies.policies if p.name == name), None)

    async def _start(self, approval: Approval, policy: LoadedPolicy, plan: Plan, signal_id: int,
                     progress: Mapping[int, StepProgress]) -> None:
        """Apply an approved plan in a task of its own, with the signal its decision was made for."""
        stored = await self._ctx.journal.signals.get.in_thread(signal_id)
        task = self.spawn(_task_name(approval), self._run(approval, policy, plan, stored.payload if stored else None,
                                                          progress))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, approval: Approval, policy: LoadedPolicy, plan: Plan, summary: Mapping[str, Any] | None,
                   progress: Mapping[int, StepProgress]) -> None:
        signal = Signal.from_summary(dict(summary)) if summary is not None else None
        if signal is None:  # pruned: apply the plan, no recovery check (it needs the signal)
            signal = Signal.from_summary({"source": "alert", "name": "approved", "labels": {},
                                          "dedup_key": plan.signal_key, "observed_at": iso_utc(self._ctx.clock())})
        with structlog.contextvars.bound_contextvars(policy=policy.name, target=policy.target.key,
                                                     approval=approval.id):
            async with self._ctx.lock_for(policy.target.key):
                await self._finish(approval.decision_id, policy, plan, progress, signal)


def _task_name(approval: Approval) -> str:
    return f"approved-{approval.id}"


class ApprovalExpiry:
    """Expires pending approvals at their deadline (journaled, announced), on the replica that may act.

    Args:
        journal: Where approvals are.
        notify: Sends an outcome event; never blocks.
        base_url: Named in the notification's command and call (read when it is made).
        may_act: Only the leader expires (its journal holds the approvals).
        interval_seconds: Longest wait between checks (a new approval's deadline is never sooner).
    """

    def __init__(self, journal: Journal, notify: Notify, metrics: Metrics, base_url: BaseUrl,
                 may_act: Callable[[], bool], clock: Callable[[], float] = time.time,
                 interval_seconds: float = 1.0) -> None:
        self._journal = journal
        self._notify = notify
        self._metrics = metrics
        self._base_url = base_url
        self._may_act = may_act
        self._clock = clock
        self.interval_seconds = interval_seconds

    async def expire_due(self) -> list[Approval]:
        """Expire what is due now; each one announced as `approval_expired`."""
        expired = await self._journal.approvals.expire.in_thread(self._clock())
        for approval in expired:
            log.info("approval expired", approval=approval.id, decision=approval.decision_id,
                     policy=approval.policy, target=approval.target)
            self._notify(approval_event(
                "approval_expired", approval, self._base_url(),
                f"approval {approval.id} expired at {iso_utc(approval.deadline)}; the plan was not applied"))
        return expired

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._may_act():
                try:
                    await self.expire_due()
                except JournalError as exc:  # tried again next interval
                    self._metrics.faults.labels("journal").inc()
                    log.warning("could not expire approvals", error=str(exc))
            await wait_or_stop(stop, self.interval_seconds)
