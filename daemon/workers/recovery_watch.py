"""Watching recovery after a plan, for the executor: one task per decision, its verdict journaled
and followed up.

Once a plan succeeded, its recovery check (`policies.planning.recovery_check`: the policy's verify
block, or the detector's own line) is journaled as in flight with the decision's final state (a
"recovery" row, status pending; the executor does that) and watched here in a task of its own, the
target lock released (the target's own new signals wait out the cooldown anyway). The verdict is a
second recovery row (recovered | not_recovered | unknown); unknown is never success. When not
recovered, onNotRecovered follows: escalate (the target is frozen, in the same transaction as the
verdict, for `escalation_freeze_seconds`; guards block every policy on a frozen target), revert (the
decision's applied steps are undone and the pins its rollback recorded cleared; the decision ends
reverted), or none. A restart resumes what was unsettled (`resume`). Verdicts (recovered,
not_recovered, escalated, a failed revert) are announced like the executor's other outcomes.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Coroutine, Protocol

import structlog

from actions.base import ActionDeps
from core.decision import DecisionState
from daemon.common.metrics import Metrics
from daemon.storage.journal import AsyncJournal
from daemon.workers.progress import journaled_plan, step_progress
from daemon.workers.state import ExecutorState
from daemon.workers.steps import StepRunner, effect_key
from daemon.workers.verifier import RangeFn, missed_samples, watch_recovery
from policies.planning import RecoveryCheck
from policies.recovery import Recovery, RecoveryVerdict

log = structlog.get_logger("tailguard.executor")  # the executor's log: watches are its work


class Announce(Protocol):
    """Hands an outcome event to the notifier; never blocks, never fails the caller."""

    def __call__(self, event: str, policy: str, target: str, message: str, **extra: Any) -> None: ...


class RecoveryWatches:
    """The recovery watches in flight (decision id -> task), and what follows their verdicts."""

    def __init__(
        self,
        journal: AsyncJournal,
        state: ExecutorState,
        steps: StepRunner,
        deps: ActionDeps,
        metrics: Metrics,
        lock_for: Callable[[str], asyncio.Lock],
        may_act: Callable[[], bool],
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        on_recorded: Callable[[], None],
        announce: Announce,
        escalation_freeze_seconds: float,
    ) -> None:
        self._journal = journal
        self._state = state
        self._steps = steps  # undoes what a decision that did not help applied
        self._deps = deps
        self._metrics = metrics
        self._lock_for = lock_for
        self._may_act = may_act
        self._clock = clock
        self._sleep = sleep
        self._on_recorded = on_recorded  # a freeze or a cleared pin was journaled (cluster state)
        self._announce = announce
        self.escalation_freeze_seconds = escalation_freeze_seconds
        # Reads back what a watch resumed after a restart missed (Prometheus range query); set by connect.
        self.query_range: RangeFn | None = None
        self._recoveries: dict[int, asyncio.Task[None]] = {}  # decision id -> its recovery watch

    def start(self, decision_id: int, policy_name: str, target: str, check: RecoveryCheck, acted_at: float) -> None:
        """Watch a decision whose plan just succeeded, in a task of its own."""
        self._spawn(decision_id, self._watch(decision_id, policy_name, target, check, acted_at, resumed=False))

    async def resume(self) -> int:
        """Go on with every recovery the journal says is unsettled (a restart): watches in flight
        (with what they missed read back) and reverts a verdict asked for that did not finish.
        Returns how many were started; ones already running are left alone (safe to call again,
        e.g. when this replica becomes the leader). Raises JournalError when the journal cannot be read."""
        started = 0
        for opened in await self._journal.open_recoveries():
            decision, row = opened.decision, opened.row
            if decision.id in self._recoveries:
                continue
            if row["status"] == "pending":
                check = RecoveryCheck.from_dict(row["data"]["check"])
                work = self._watch(decision.id, decision.policy, decision.target, check,
                                   float(row["data"]["acted_at"]), resumed=True)
            else:
                verdict = RecoveryVerdict(Recovery(row["status"]), row["message"])
                work = self._revert_unrecovered(decision.id, decision.policy, verdict)
            log.info("resuming recovery after restart", decision=decision.id, policy=decision.policy,
                     recovery=row["status"])
            self._spawn(decision.id, work)
            started += 1
        return started

    async def wait(self) -> None:
        """Wait until every recovery watch running now has settled (tests, demo)."""
        while self._recoveries:
            await asyncio.wait(set(self._recoveries.values()))

    async def close(self) -> None:
        """Stop the watches; what they did not settle stays in the journal (resumed at the next start)."""
        tasks = list(self._recoveries.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._recoveries.clear()

    def _spawn(self, decision_id: int, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"recovery-{decision_id}")
        self._recoveries[decision_id] = task
        task.add_done_callback(lambda done: self._settled(decision_id, done))

    def _settled(self, decision_id: int, task: asyncio.Task[None]) -> None:
        if self._recoveries.get(decision_id) is task:
            del self._recoveries[decision_id]
        if not task.cancelled() and task.exception() is not None:
            self._metrics.faults.labels("recovery").inc()
            log.error("recovery watch failed; left pending for the next start", decision=decision_id,
                      error=repr(task.exception()))

    async def _watch(self, decision_id: int, policy_name: str, target: str, check: RecoveryCheck,
                     acted_at: float, resumed: bool) -> None:
        """Watch one decision's recovery to a verdict, journal it, and follow up."""
        with structlog.contextvars.bound_contextvars(policy=policy_name, target=target, decision=decision_id):
            missed = await missed_samples(check, acted_at, self._clock(), self.query_range) if resumed else []
            watched = await watch_recovery(check, acted_at, self._deps.query, self._clock, self._sleep, missed)
            verdict = watched.verdict
            follow_up = None if verdict.state is Recovery.RECOVERED else check.on_not_recovered
            data: dict[str, Any] = {
                "verdict": verdict.state.value, "held_from": verdict.held_from, "samples": len(watched.samples),
                "last_samples": [list(p) for p in watched.samples[-20:]], "query_errors": watched.query_errors,
                "last_error": watched.last_error, "follow_up": follow_up, "check": check.as_dict()}
            message, freeze = verdict.reason, None
            if follow_up == "escalate":
                until = self._clock() + self.escalation_freeze_seconds
                freeze = (target, f"policy {policy_name}, decision {decision_id}: {verdict.state.value}: "
                                  f"{verdict.reason}", until)
                data["frozen_until"] = until
                message += f"; escalated: {target} frozen until {_iso(until)}"
            elif follow_up is not None:
                message += f"; onNotRecovered: {follow_up}"
            await self._journal.record_verdict(decision_id, verdict.state.value, message, data, freeze)
            if freeze is not None:
                self._on_recorded()  # a freeze is shared state: a new leader must see it
            log.info("recovery verdict", verdict=verdict.state, reason=verdict.reason, follow_up=follow_up,
                     samples=len(watched.samples))
            event = "recovered" if verdict.state is Recovery.RECOVERED else "not_recovered"
            self._announce(event, policy_name, target, message, decision=decision_id, verdict=verdict.state.value,
                           query=check.query, condition=check.condition.describe(), follow_up=follow_up)
            if freeze is not None:
                self._announce("escalated", policy_name, target, f"{target} frozen: {freeze[1]}",
                               decision=decision_id, verdict=verdict.state.value, frozen_until=_iso(freeze[2]))
            elif follow_up == "revert":
                await self._revert_unrecovered(decision_id, policy_name, verdict)

    async def _revert_unrecovered(self, decision_id: int, policy_name: str, verdict: RecoveryVerdict) -> None:
        """Undo the steps a decision that did not help applied (onNotRecovered: revert), clear the pins
        its rollback recorded, and end the decision reverted (failed when a revert failed)."""
        decision = await self._journal.decision(decision_id)
        if decision is None:
            return
        policy = next((p for p in self._state.policies.policies if p.name == policy_name), None)
        plan = journaled_plan(decision.plan)
        why = f"{decision.reason}; did not recover ({verdict.state.value})"
        if policy is None or [s.action for s in plan.steps] != [b.kind for b in policy.actions]:
            reason = f"{why}; not reverted: policy {policy_name} is gone or now runs other actions"
            await self._journal.finish_decision(decision_id, DecisionState.FAILED, reason)
            self._metrics.decisions.labels(policy_name, DecisionState.FAILED).inc()
            self._announce("failed", policy_name, decision.target, reason, decision=decision_id)
            return
        if not self._may_act():
            log.warning("revert after no recovery left for the leader: this replica may not act",
                        decision=decision_id)
            return
        async with self._lock_for(decision.target):
            rows = await self._journal.steps(decision_id)
            progress = step_progress(rows)
            applied = [(idx, replace(step, effect_key=effect_key(decision_id, idx)))
                       for idx, step in enumerate(plan.steps)
                       if not step.noop and idx in progress and progress[idx].landed]
            not_reverted = await self._steps.revert(decision_id, policy, applied, progress)
            pinned = {int(r["idx"]) for r in rows if r["phase"] == "verify" and r["data"].get("pin")}
            if pinned and not pinned & set(not_reverted):
                await self._journal.clear_pin(decision.target, f"reverted: decision {decision_id} did not recover "
                                                               f"({verdict.state.value})")
                self._on_recorded()
            state = DecisionState.FAILED if not_reverted else DecisionState.REVERTED
            reason = f"{why}; revert failed for step(s) {not_reverted}" if not_reverted else f"{why}; reverted"
            await self._journal.finish_decision(decision_id, state, reason)
        self._metrics.decisions.labels(policy_name, state).inc()
        log.info("reverted after no recovery", state=state, reason=reason)
        if not_reverted:
            self._announce("failed", policy_name, decision.target, reason, decision=decision_id)


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="seconds")
