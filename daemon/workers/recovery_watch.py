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
reverted), or none. Unknown (incomplete evidence, `policies.recovery.judge_recovery`: no data, an
outage after some samples, a gap a hold fits in, fewer samples than the hold needs) never reverts: the
detectors are as blind as the check, and undoing a rollback that may have worked puts the bad version
back. Where onNotRecovered says revert (or
escalate), unknown escalates instead and says it could not tell; with none it is journaled only.
A restart resumes what was unsettled (`resume`); an unknown verdict an older version left waiting
for its revert, or a not_recovered one it judged without asking for complete evidence (no
`complete_evidence` in its data), is escalated, not reverted. Verdicts (recovered,
not_recovered, escalated, a failed revert) are announced like the executor's other outcomes.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Awaitable, Callable, Coroutine, Protocol

import structlog

from core.timestamps import iso_utc
from core.decision import DecisionState
from daemon.common.lifecycle import Spawn, plain_spawn
from daemon.storage.errors import JournalError, JournalFenced, JournalValueError
from daemon.storage.records import FreezeRequest, RecoveryRow
from daemon.storage.step_kinds import StepPhase, StepStatus
from daemon.workers.decision_events import verdict_event
from daemon.workers.backlog import JOURNAL_RETRY_MAX_SECONDS
from daemon.workers.context import ActContext
from daemon.workers.progress import journaled_plan, runs_on, step_progress
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

    def __init__(self, ctx: ActContext, steps: StepRunner, announce: Announce, escalation_freeze_seconds: float,
                 query_range: RangeFn | None = None) -> None:
        self._ctx = ctx  # the executor's: its journal, state, clients, locks, leadership, clock, sleep
        self._steps = steps  # undoes what a decision that did not help applied
        self._announce = announce
        self.escalation_freeze_seconds = escalation_freeze_seconds
        # Reads back what a watch resumed after a restart missed (Prometheus range query; None: nothing).
        self._query_range = query_range
        self._recoveries: dict[int, asyncio.Task[None]] = {}  # decision id -> its recovery watch
        self.spawn: Spawn = plain_spawn  # the service hands the supervisor's: a crash counts in its budget
        # Sharding: whether this replica leads a target's shard; `resume` takes only those (the
        # others' verdicts are fenced by their shard's term: their leader resumes them).
        self.owns: Callable[[str], bool] | None = None

    def start(self, decision_id: int, policy_name: str, target: str, check: RecoveryCheck, acted_at: float) -> None:
        """Watch a decision whose plan just succeeded, in a task of its own."""
        self._spawn(decision_id, self._watch(decision_id, policy_name, target, check, acted_at, resumed=False))

    async def resume(self) -> int:
        """Go on with every recovery the journal says is unsettled (a restart): watches in flight
        (with what they missed read back) and reverts a verdict asked for that did not finish.
        Returns how many were started; ones already running are left alone (safe to call again,
        e.g. when this replica becomes the leader). Raises JournalError when the journal cannot be read."""
        started = 0
        for opened in await self._ctx.journal.decisions.open_recoveries.in_thread():
            decision, row = opened.decision, opened.row
            if decision.id in self._recoveries or (self.owns is not None and not self.owns(decision.target)):
                continue
            if row.status == StepStatus.PENDING:
                check = RecoveryCheck.from_dict(row.data["check"])
                work = self._watch(decision.id, decision.policy, decision.target, check,
                                   float(row.data["acted_at"]), resumed=True)
            elif row.status == StepStatus.UNKNOWN or not row.data.get("complete_evidence"):
                # An older version judged "not recovered" on whatever it had: not proof enough to revert.
                work = self._escalate_unknown(decision.id, decision.policy, decision.target, row)
            else:
                verdict = RecoveryVerdict(Recovery(row.status.value), row.message)
                work = self._revert_unrecovered(decision.id, decision.policy, verdict)
            log.info("resuming recovery after restart", decision=decision.id, policy=decision.policy,
                     recovery=row.status)
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
        task = self.spawn(f"recovery-{decision_id}", work)
        self._recoveries[decision_id] = task
        task.add_done_callback(lambda done: self._settled(decision_id, done))

    def _settled(self, decision_id: int, task: asyncio.Task[None]) -> None:
        if self._recoveries.get(decision_id) is task:
            del self._recoveries[decision_id]
        if not task.cancelled() and task.exception() is not None:
            self._ctx.metrics.faults.labels("recovery").inc()
            log.error("recovery watch failed; left pending for the next start", decision=decision_id,
                      error=repr(task.exception()))

    async def _watch(self, decision_id: int, policy_name: str, target: str, check: RecoveryCheck,
                     acted_at: float, resumed: bool) -> None:
        """Watch one decision's recovery to a verdict, journal it, and follow up."""
        with structlog.contextvars.bound_contextvars(policy=policy_name, target=target, decision=decision_id):
            missed = await missed_samples(check, acted_at, self._ctx.clock(), self._query_range) if resumed else []
            watched = await watch_recovery(check, acted_at, self._ctx.deps.query, self._ctx.clock, self._ctx.sleep,
                                           missed)
            verdict = watched.verdict
            follow_up = follow_up_of(verdict.state, check.on_not_recovered)
            data: dict[str, Any] = {
                "verdict": verdict.state.value, "held_from": verdict.held_from, "samples": len(watched.samples),
                "last_samples": [list(p) for p in watched.samples[-20:]], "query_errors": watched.query_errors,
                "last_error": watched.last_error, "follow_up": follow_up, "check": check.as_dict(),
                "complete_evidence": verdict.state is not Recovery.UNKNOWN}
            message, freeze = verdict.reason, None
            if verdict.state is Recovery.UNKNOWN:
                message = could_not_tell(verdict.reason, check.on_not_recovered)
            if follow_up == "escalate":
                until = self._ctx.clock() + self.escalation_freeze_seconds
                freeze = FreezeRequest(target, f"policy {policy_name}, decision {decision_id}: {verdict.state.value}: "
                                               f"{verdict.reason}", until)
                data["frozen_until"] = until
                message += f"; escalated: {target} frozen until {iso_utc(until)}"
            elif follow_up is not None:
                message += f"; onNotRecovered: {follow_up}"
            await self._retrying("the recovery verdict", lambda: self._ctx.journal.decisions.record_verdict.in_thread(
                decision_id, StepStatus(verdict.state.value), message, data, freeze))
            if freeze is not None:
                self._ctx.on_recorded()  # a freeze is shared state: a new leader must see it
            log.info("recovery verdict", verdict=verdict.state, reason=verdict.reason, follow_up=follow_up,
                     samples=len(watched.samples))
            await self._verdict_event(policy_name, verdict.state.value, message)
            event = "recovered" if verdict.state is Recovery.RECOVERED else "not_recovered"
            self._announce(event, policy_name, target, message, decision=decision_id, verdict=verdict.state.value,
                           query=check.query, condition=check.condition.describe(), follow_up=follow_up)
            if freeze is not None:
                self._announce("escalated", policy_name, target, f"{target} frozen: {freeze.reason}",
                               decision=decision_id, verdict=verdict.state.value, frozen_until=iso_utc(freeze.until))
            elif follow_up == "revert":
                await self._revert_unrecovered(decision_id, policy_name, verdict)

    async def _retrying(self, what: str, write: Callable[[], Awaitable[Any]]) -> Any:
        """A journal write of the watch, retried after 1 s, 2 s ... (at most JOURNAL_RETRY_MAX_SECONDS)
        while the journal fails and this replica may act: a verdict is not parked until the next start
        by a PostgreSQL restart. A fenced write (another replica leads) or a value that cannot be
        stored is not retried; nor is anything once this replica may not act (left to the next leader)."""
        attempt = 0
        while True:
            try:
                return await write()
            except (JournalFenced, JournalValueError):
                raise
            except JournalError as exc:
                self._ctx.metrics.faults.labels("journal").inc()
                if not self._ctx.may_act():
                    raise
                attempt += 1
                delay = min(JOURNAL_RETRY_MAX_SECONDS, 2.0 ** (attempt - 1))
                log.warning(f"could not journal {what}; retrying", attempt=attempt, retry_in_seconds=delay,
                            error=str(exc))
                await self._ctx.sleep(delay)

    async def _escalate_unknown(self, decision_id: int, policy_name: str, target: str,
                                row: RecoveryRow) -> None:
        """An unknown verdict left waiting for its revert (journaled by a version that reverted on
        unknown): escalate it instead, as a new verdict row with the freeze, so it is settled."""
        with structlog.contextvars.bound_contextvars(policy=policy_name, target=target, decision=decision_id):
            until = self._ctx.clock() + self.escalation_freeze_seconds
            reason = could_not_tell(str(row.message), "revert")
            freeze = FreezeRequest(target, f"policy {policy_name}, decision {decision_id}: unknown: {reason}", until)
            data = {**row.data, "verdict": Recovery.UNKNOWN.value, "follow_up": "escalate", "frozen_until": until,
                    "escalated_instead_of": "revert"}
            message = f"{reason}; escalated: {target} frozen until {iso_utc(until)}"
            await self._retrying("the recovery verdict", lambda: self._ctx.journal.decisions.record_verdict.in_thread(
                decision_id, StepStatus.UNKNOWN, message, data, freeze))
            self._ctx.on_recorded()
            log.warning("unknown recovery escalated instead of reverted", reason=reason)
            await self._verdict_event(policy_name, Recovery.UNKNOWN.value, message)
            self._announce("escalated", policy_name, target, f"{target} frozen: {freeze.reason}", decision=decision_id,
                           verdict=Recovery.UNKNOWN.value, frozen_until=iso_utc(until))

    async def _verdict_event(self, policy_name: str, verdict: str, message: str) -> None:
        """The verdict as a Kubernetes Event on the policy's target; a courtesy: a failure is counted."""
        policy = next((p for p in self._ctx.state.policies.policies if p.name == policy_name), None)
        if policy is None or self._ctx.deps.record_event is None:
            return
        reason, warning = verdict_event(verdict)
        try:
            await self._ctx.deps.record_event(policy=policy, reason=reason, message=message, warning=warning)
        except Exception as exc:
            self._ctx.metrics.faults.labels("events").inc()
            log.warning("could not record Kubernetes event", error=str(exc))

    async def _revert_unrecovered(self, decision_id: int, policy_name: str, verdict: RecoveryVerdict) -> None:
        """Undo the steps a decision that did not help applied (onNotRecovered: revert), clear the pins
        its rollback recorded, and end the decision reverted (failed when a revert failed)."""
        decision = await self._ctx.journal.decisions.get.in_thread(decision_id)
        if decision is None:
            return
        current = next((p for p in self._ctx.state.policies.policies if p.name == policy_name), None)
        plan = journaled_plan(decision.plan)
        why = f"{decision.reason}; did not recover ({verdict.state.value})"
        runs = runs_on(decision.plan, current, self._ctx.actions)  # the policy it started with, not the reloaded one
        policy = runs.policy
        if policy is None:
            reason = f"{why}; not reverted: {runs.why}"
            await self._ctx.journal.decisions.finish.in_thread(decision_id, DecisionState.FAILED, reason)
            self._ctx.metrics.decisions.labels(policy_name, DecisionState.FAILED).inc()
            self._announce("failed", policy_name, decision.target, reason, decision=decision_id)
            return
        if not self._ctx.may_act():
            log.warning("revert after no recovery left for the leader: this replica may not act",
                        decision=decision_id)
            return
        async with self._ctx.lock_for(decision.target):
            rows = await self._ctx.journal.decisions.steps.in_thread(decision_id)
            progress = step_progress(rows)
            applied = [(idx, replace(step, effect_key=effect_key(decision_id, idx)))
                       for idx, step in enumerate(plan.steps)
                       if not step.noop and idx in progress and progress[idx].landed]
            not_reverted = await self._steps.revert(decision_id, policy, applied, progress)
            pinned = {int(r.idx) for r in rows if r.phase == StepPhase.VERIFY and r.data.get("pin")}
            if pinned and not pinned & set(not_reverted):
                await self._ctx.journal.pins.clear.in_thread(
                    decision.target, f"reverted: decision {decision_id} did not recover ({verdict.state.value})")
                self._ctx.on_recorded()
            state = DecisionState.FAILED if not_reverted else DecisionState.REVERTED
            reason = f"{why}; revert failed for step(s) {not_reverted}" if not_reverted else f"{why}; reverted"
            if runs.reloaded:
                reason += f" on {runs.why}"
            await self._retrying("the reverted decision", lambda: self._ctx.journal.decisions.finish.in_thread(
                decision_id, state, reason))
        self._ctx.metrics.decisions.labels(policy_name, state).inc()
        log.info("reverted after no recovery", state=state, reason=reason)
        if not_reverted:
            self._announce("failed", policy_name, decision.target, reason, decision=decision_id)


def follow_up_of(verdict: Recovery, on_not_recovered: str) -> str | None:
    """What follows a verdict: nothing when recovered; onNotRecovered when not recovered; when
    unknown never a revert: escalate where onNotRecovered says revert or escalate, else none."""
    if verdict is Recovery.RECOVERED:
        return None
    if verdict is Recovery.UNKNOWN and on_not_recovered == "revert":
        return "escalate"
    return on_not_recovered


def could_not_tell(reason: str, on_not_recovered: str) -> str:
    """The message of an unknown verdict: it could not tell, and (for revert) why nothing was undone."""
    text = f"could not tell whether it recovered: {reason}"
    if on_not_recovered == "revert":
        text += ("; not reverted: without complete data the rollback may have worked, and undoing it would bring "
                 "the old version back")
    return text
