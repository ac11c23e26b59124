"""The executor: journaled signal -> matching policies -> guards -> observe -> plan -> apply/verify.

One lock per target: events for one target run in order, different targets in parallel.
Everything except cancellation becomes an Outcome in the journal.

Every apply is journaled twice: its intent before the call (phase "intent": the step, the attempt,
the effect key "<decision id>/<step index>" that the action marks its change with) and its result
after. A decision found `executing` after a restart is resumed, never re-planned: its journaled
plan (with the true `before` a revert needs) and step rows say how far each step got. A step with
a final result is not called again (an applied one still counts for revert); a step whose intent
has no result is re-observed first: when `verify` answers OK its change had landed and it is
recorded as applied (recovered after restart), else it is applied again; a step never started is
applied as usual. Delivery per action: docs/design-notes.md.

Retries: only a transient failure (a TemporaryError, or an Outcome marked retryable) is applied again,
up to MAX_APPLY_ATTEMPTS, after the backoff (1 s, 2 s ...) or the TemporaryError's `delay_seconds`,
whichever is longer (a failure asking for more than MAX_RETRY_DELAY_SECONDS fails the step). An
exception that is no ActionError is a bug, never retried: its step fails at once, journaled with the
exception's type and message, counted in tailguard_faults_total{component="actions"} and logged with
its traceback; onFailure follows as for any failed step.

A `notify` step never stops a plan: when it fails it is journaled failed and the plan goes on.

Recovery: once a plan succeeded, its recovery check (`policies.planning.recovery_check`: the policy's
verify block, or the detector's own line) is journaled as in flight with the decision's final state
(a "recovery" row, status pending) and watched in a task of its own, the target lock released (the
target's own new signals wait out the cooldown anyway). The verdict is a second recovery row
(recovered | not_recovered | unknown); unknown is never success. When not recovered, onNotRecovered
follows: escalate (the target is frozen, in the same transaction as the verdict, for
`escalation_freeze_seconds`; guards block every policy on a frozen target), revert (the decision's
applied steps are undone and the pins its rollback recorded cleared; the decision ends reverted),
or none. A restart resumes what was unsettled (`resume_verifications`). Outcomes (acted, failed,
recovered, not_recovered, escalated) go to `notify`, a callback that never blocks.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Coroutine, Mapping, TypeVar

import structlog

from actions.base import Action, ActionDeps, Step
from actions.notify import KIND as NOTIFY_KIND
from core.decision import DecisionState
from core.outcome import ActionError, Outcome, OutcomeStatus, TemporaryError
from core.signal import Signal, SignalSource
from daemon.common.config import BlastRadiusSettings
from daemon.common.metrics import Metrics
from daemon.storage.journal import DAEMON_SCOPE, FOREVER, RECOVERY, Approval, AsyncJournal, Decision
from daemon.workers.approvals import approval_event
from daemon.workers.blast_guard import BlastGuard, escalates
from daemon.workers.progress import (INTENT, MAX_APPLY_ATTEMPTS, StepProgress, journaled_plan,
                                     step_progress)
from daemon.workers.shadow import ShadowOrigin, shadow_origin
from daemon.workers.silences import SilenceCheck, describe_all, target_labels
from daemon.workers.state import ExecutorState
from daemon.workers.verifier import RangeFn, missed_samples, watch_recovery
from policies.guards import GuardDecision, GuardState, check_guards
from policies.loader import LoadedPolicy
from policies.matching import matching_policies
from policies.planning import Plan, RecoveryCheck, blocked_plan, build_plan, recovery_check
from policies.recovery import Recovery, RecoveryVerdict

log = structlog.get_logger("tailguard.executor")

T = TypeVar("T")
MAX_RETRY_DELAY_SECONDS = 60.0
"""The longest wait before a retry of an apply (the target stays locked meanwhile): an action that
asks for more (`TemporaryError.delay_seconds`) has its step failed instead of retried."""
RETRY_AFTER = "retry_after_seconds"  # Outcome data: the least wait a transient failure asks for
Notify = Callable[[Mapping[str, Any]], None]  # an outcome event to send; returns at once, never blocks


def effect_key(decision_id: int, idx: int) -> str:
    """The key of one step's effect (`Step.effect_key`): the same on every attempt and after a restart."""
    return f"{decision_id}/{idx}"


class Executor:
    def __init__(
        self,
        journal: AsyncJournal,
        state: ExecutorState,
        registry: Mapping[str, type[Action]],
        deps: ActionDeps,
        metrics: Metrics,
        may_act: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_recorded: Callable[[], None] = lambda: None,
        notify: Notify = lambda event: None,
        escalation_freeze_seconds: float = 3600.0,
        blast_radius: BlastRadiusSettings | None = None,
        approval_base_url: str = "http://127.0.0.1:8080",
    ) -> None:
        self._journal = journal
        self.state = state
        self._registry = registry
        self._deps = deps
        self._metrics = metrics
        self._may_act = may_act
        self._clock = clock
        self._sleep = sleep
        self._on_recorded = on_recorded  # an executed plan or a pin was journaled (cluster state)
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._actions: dict[str, Action] = {}
        self._notify = notify
        self.escalation_freeze_seconds = escalation_freeze_seconds
        self._blast = BlastGuard(journal, state, blast_radius or BlastRadiusSettings(), clock, sleep)
        # Reads back what a watch resumed after a restart missed (Prometheus range query); set by connect.
        self.query_range: RangeFn | None = None
        self._recoveries: dict[int, asyncio.Task[None]] = {}  # decision id -> its recovery watch
        self.approval_base_url = approval_base_url  # named in approval notifications
        self._approved: set[asyncio.Task[None]] = set()  # approved plans being applied
        # Asks Alertmanager whether a silence covers a detector signal's target; set by connect when
        # alertmanager.url is configured (None: no silences are consulted).
        self.silences: SilenceCheck | None = None

    def lock_for(self, target_key: str) -> asyncio.Lock:
        """The lock that keeps one actor at a time on a target (shared with the pin reconciler)."""
        return self._locks[target_key]

    def _action(self, kind: str) -> Action:
        if kind not in self._actions:
            self._actions[kind] = self._registry[kind](self._deps)
        return self._actions[kind]

    async def process(self, signal_id: int, signal: Signal) -> list[Plan]:
        """Decide and act for one journaled signal, then mark it processed."""
        plans = []
        policies = matching_policies(self.state.policies.policies, signal)
        with structlog.contextvars.bound_contextvars(signal=signal.dedup_key, signal_name=signal.name):
            if not policies:
                log.info("signal matched no policy", labels=dict(signal.labels))
            else:
                await self._blast.hold()  # with common-cause suppression on: let a burst show first
            for policy in policies:
                self._metrics.matched.labels(policy.name).inc()
                async with self._locks[policy.target.key]:
                    with structlog.contextvars.bound_contextvars(policy=policy.name,
                                                                 target=policy.target.key):
                        plans.append(await self._run_policy(signal_id, signal, policy))
            await self._journal.mark_processed(signal_id)
        return plans

    async def _run_policy(self, signal_id: int, signal: Signal, policy: LoadedPolicy) -> Plan:
        existing = await self._journal.decision_for(signal_id, policy.name)
        if existing is not None and existing.state.final:
            log.info("already decided", state=existing.state)
            return Plan(policy.name, policy.target.key, signal.dedup_key, (), False,
                        blocked=f"already decided: {existing.state}")
        if existing is not None:
            # Crashed mid-execution: finish the journaled plan; guards already passed, and a new plan
            # would be made from a world our own landed steps changed (a false `before`).
            return await self._resume(existing, policy, signal)
        shadow = shadow_origin(policy, signal)
        if shadow is not None:
            return await self._run_shadow(signal_id, signal, policy, shadow)
        decision = await self._guard(policy, commit=True)
        if decision.allowed and policy.spec.approval == "required":
            waiting = await self._journal.pending_approval(policy.name, policy.target.key)
            if waiting is not None:  # one plan waits per policy and target; flapping signals add none
                decision = GuardDecision(False, f"awaiting approval {waiting.id} (decision {waiting.decision_id}) "
                                                f"until {_iso(waiting.deadline)}")
        note: dict[str, Any] = {}
        if decision.allowed:
            decision, note = await self._silenced(policy, signal, decision)
        if not decision.allowed:
            plan = blocked_plan(policy, signal, decision)
            blocked_id = await self._decide(signal_id, policy, plan, DecisionState.BLOCKED, decision.reason,
                                            executed=False, extra=note)
            if escalates(decision):
                self._announce("escalated", policy.name, policy.target.key, decision.reason,
                               decision=blocked_id, signal=signal.dedup_key)
            return plan
        try:
            steps = await self._plan_steps(policy, signal)
        except ActionError as exc:
            plan = Plan(policy.name, policy.target.key, signal.dedup_key, (), policy.spec.guards.dry_run,
                        blocked=f"planning failed: {exc}")
            failed_id = await self._decide(signal_id, policy, plan, DecisionState.FAILED, plan.blocked or "",
                                           executed=False, extra=note)
            for bound in policy.actions:
                self._metrics.actions.labels(bound.kind, "failed").inc()
            await self._event(policy, "RemediationFailed", plan.blocked or "", warning=True)
            self._announce("failed", policy.name, policy.target.key, plan.blocked or "", decision=failed_id,
                           state=DecisionState.FAILED.value, signal=signal.dedup_key)
            return plan
        plan = build_plan(policy, signal, steps)
        if plan.blocked:
            await self._decide(signal_id, policy, plan, DecisionState.NOOP, plan.blocked, executed=False, extra=note)
            return plan
        if plan.dry_run:
            await self._decide(signal_id, policy, plan, DecisionState.DRY_RUN, "dryRun: planned, not applied",
                               executed=False, extra=note)
            return plan
        if policy.spec.approval == "required":
            await self._request_approval(signal_id, policy, plan)
            return plan
        # Journaled as executed before the first write: a crash mid-way still counts for cooldown.
        decision_id = await self._decide(signal_id, policy, plan, DecisionState.EXECUTING, "applying",
                                         executed=True, extra=note)
        self._on_recorded()
        await self._finish(decision_id, policy, plan, {}, signal)
        return plan

    async def _run_shadow(self, signal_id: int, signal: Signal, policy: LoadedPolicy, origin: ShadowOrigin) -> Plan:
        """What a shadow trigger's signal would have done, journaled and never applied: guards read
        (not committed: the escalate-once memory stays the live triggers'), the target observed, the
        plan built. Not `executed`, so it never counts toward cooldown or rate limit."""
        label = origin.label
        decision = await self._guard(policy)
        if decision.allowed and policy.spec.approval == "required":
            waiting = await self._journal.pending_approval(policy.name, policy.target.key)
            if waiting is not None:
                decision = GuardDecision(False, f"awaiting approval {waiting.id}")
        if decision.allowed:
            decision, note = await self._silenced(policy, signal, decision)
            if not decision.allowed:
                plan = blocked_plan(policy, signal, decision)
                await self._decide_shadow(signal_id, policy, plan, origin, "silenced", DecisionState.BLOCKED,
                                          f"{label}: would be {decision.reason}", note)
                return plan
        if not decision.allowed:
            plan = blocked_plan(policy, signal, decision)
            await self._decide_shadow(signal_id, policy, plan, origin, "blocked", DecisionState.BLOCKED,
                                      f"{label}: would be blocked: {decision.reason}")
            return plan
        try:
            steps = await self._plan_steps(policy, signal)
        except ActionError as exc:
            plan = Plan(policy.name, policy.target.key, signal.dedup_key, (), policy.spec.guards.dry_run,
                        blocked=f"planning failed: {exc}")
            await self._decide_shadow(signal_id, policy, plan, origin, "fail", DecisionState.DRY_RUN,
                                      f"{label}: would fail: planning failed: {exc}")
            return plan
        plan = build_plan(policy, signal, steps)
        if plan.blocked:
            await self._decide_shadow(signal_id, policy, plan, origin, "noop", DecisionState.NOOP,
                                      f"{label}: {plan.blocked}")
            return plan
        how = ("would only plan (dryRun)" if plan.dry_run else
               "would ask for approval, then apply" if policy.spec.approval == "required" else "would apply")
        summary = "; ".join(s.summary for s in plan.steps if not s.noop)
        await self._decide_shadow(signal_id, policy, plan, origin, "act", DecisionState.DRY_RUN,
                                  f"{label}: {how}: {summary}; not applied")
        return plan

    async def _decide_shadow(self, signal_id: int, policy: LoadedPolicy, plan: Plan, origin: ShadowOrigin,
                             would: str, state: DecisionState, reason: str,
                             note: Mapping[str, Any] | None = None) -> int:
        self._metrics.shadow_decisions.labels(policy.name, would).inc()
        return await self._decide(signal_id, policy, plan, state, reason, executed=False,
                                  extra={**(note or {}), "shadow": {**origin.as_dict(), "would": would}})

    async def _silenced(self, policy: LoadedPolicy, signal: Signal,
                        decision: GuardDecision) -> tuple[GuardDecision, dict[str, Any]]:
        """Ask Alertmanager about a detector signal (alerts are silenced there already; a schedule
        tick is not an incident): a matching silence blocks, like a guard. When the silences cannot
        be read the decision stands and the note says so (journaled in the plan)."""
        if self.silences is None or signal.source is not SignalSource.DETECTOR:
            return decision, {}
        verdict = await self.silences(target_labels(signal.labels, policy.target.model))
        if verdict.silenced:
            log.info("silenced", reason=verdict.reason)
            return (GuardDecision(False, verdict.reason),
                    {"silences": {"checked": True, "matched": describe_all(verdict.matched)}})
        if verdict.error is not None:
            return decision, {"silences": {"checked": False, "error": verdict.error,
                                           "note": "acted without silences: Alertmanager did not answer"}}
        return decision, {"silences": {"checked": True, "matched": []}}

    async def _resume(self, decision: Decision, policy: LoadedPolicy, signal: Signal) -> Plan:
        """Go on with a decision left `executing` by a crash, from its journaled plan and steps."""
        plan = journaled_plan(decision.plan)
        planned, kinds = [s.action for s in plan.steps], [bound.kind for bound in policy.actions]
        if planned != kinds:
            reason = (f"not resumed after restart: policy {policy.name} now runs {kinds}, the journaled plan "
                      f"{planned}; steps applied before the restart are left as they are")
            await self._journal.finish_decision(decision.id, DecisionState.FAILED, reason)
            self._metrics.decisions.labels(policy.name, DecisionState.FAILED).inc()
            log.warning("decision not resumed", decision=decision.id, reason=reason)
            return plan
        log.info("resuming decision after restart", decision=decision.id, plan=[s.summary for s in plan.steps])
        await self._finish(decision.id, policy, plan, step_progress(await self._journal.steps(decision.id)), signal)
        return plan

    async def _finish(self, decision_id: int, policy: LoadedPolicy, plan: Plan,
                      progress: Mapping[int, StepProgress], signal: Signal) -> None:
        state, reason = await self._execute(decision_id, policy, plan, progress)
        check = self._recovery_check(policy, signal) if state is DecisionState.SUCCEEDED else None
        acted_at = self._clock()
        pending = None
        if check is not None:
            pending = (f"checking: {check.query} {check.condition.describe()} ({check.source})",
                       {"check": check.as_dict(), "acted_at": acted_at, "signal": signal.dedup_key})
        # One transaction: a restart finds the check in flight with the decision, or neither.
        await self._journal.finish_decision(decision_id, state, reason, pending)
        self._metrics.decisions.labels(policy.name, state).inc()
        log.info("plan finished", state=state, reason=reason, recovery=check.as_dict() if check else None)
        acted = state is DecisionState.SUCCEEDED
        self._announce("acted" if acted else "failed", policy.name, policy.target.key, reason,
                       decision=decision_id, state=state.value, signal=signal.dedup_key)
        if check is not None:
            self._spawn(decision_id, self._watch(decision_id, policy.name, policy.target.key, check, acted_at,
                                                 resumed=False))
        elif acted and policy.detectors and policy.spec.verify is None:
            await self._journal.record_step(
                decision_id, -1, RECOVERY, RECOVERY, "skipped",
                f"no recovery check: {signal.source.value} signal {signal.name} carries no detector line and "
                "the policy has no verify block", {"signal": signal.dedup_key}, None)

    def _recovery_check(self, policy: LoadedPolicy, signal: Signal) -> RecoveryCheck | None:
        try:
            return recovery_check(policy, signal)
        except Exception:  # a query that cannot be rendered: acting stands, only the check is lost
            self._metrics.faults.labels("recovery").inc()
            log.exception("recovery check could not be built")
            return None

    async def preview(self, signal: Signal) -> list[Plan]:
        """What `process` would decide for `signal` now: guards checked against the journal, targets
        observed, plans computed; nothing journaled, nothing applied (`tailguard simulate`)."""
        plans = []
        for policy in matching_policies(self.state.policies.policies, signal):
            decision = await self._guard(policy)
            if not decision.allowed:
                plans.append(blocked_plan(policy, signal, decision))
                continue
            try:
                plans.append(build_plan(policy, signal, await self._plan_steps(policy, signal)))
            except ActionError as exc:
                plans.append(Plan(policy.name, policy.target.key, signal.dedup_key, (),
                                  policy.spec.guards.dry_run, blocked=f"planning failed: {exc}"))
        return plans

    async def _guard(self, policy: LoadedPolicy, *, commit: bool = False) -> GuardDecision:
        now = self._clock()
        if not self.state.frozen:  # the config's global freeze says it first
            blocked = await self._frozen(policy, now)
            if blocked is not None:
                return blocked
            across = await self._blast.check(policy, commit=commit)
            if across is not None:
                return across
        last, count = await self._journal.guard_history(
            policy.name, policy.target.key, policy.spec.guards.max_actions_window, now)
        return check_guards(policy.spec.guards, GuardState(last, count, self.state.frozen), now)

    async def _frozen(self, policy: LoadedPolicy, now: float) -> GuardDecision | None:
        """The runtime freeze in force on the whole daemon, else on the policy's target (None: neither)."""
        daemon = await self._journal.active_freeze(DAEMON_SCOPE, now)
        if daemon is not None:
            return GuardDecision(False, f"daemon frozen: {daemon.reason}{_until(daemon.until)}; "
                                        "lift with `tailguard unfreeze`")
        freeze = await self._journal.active_freeze(policy.target.key, now)
        if freeze is not None:
            return GuardDecision(False, f"target frozen: {freeze.reason}{_until(freeze.until)}; "
                                        f"lift with `tailguard unfreeze {freeze.target}`")
        return None

    # ---- approvals -------------------------------------------------------------------------------

    async def _request_approval(self, signal_id: int, policy: LoadedPolicy, plan: Plan) -> Approval:
        """Journal the plan as waiting for an operator until the policy's deadline, and announce it."""
        deadline = self._clock() + policy.spec.approval_timeout_seconds
        approval = await self._journal.request_approval(signal_id, policy.name, policy.target.key,
                                                        plan.as_dict(), deadline)
        self._metrics.decisions.labels(policy.name, DecisionState.BLOCKED).inc()
        log.info("plan awaits approval", approval=approval.id, decision=approval.decision_id,
                 deadline=_iso(deadline), plan=[s.summary for s in plan.steps])
        summary = "; ".join(s.summary for s in plan.steps if not s.noop)
        self._send(approval_event("approval_requested", approval, self.approval_base_url,
                                  f"plan awaits approval {approval.id} until {_iso(deadline)}: {summary}"))
        return approval

    async def approve(self, approval_id: int, by: str, reason: str) -> tuple[int, str, Approval | None]:
        """Approve a pending plan and start applying it (in the background). Returns (HTTP status,
        one-line message, the approval): 202 started; 404 no such approval; 409 not pending, past its
        deadline, its policy gone or changed, or a freeze in force (it stays pending: lift, then approve)."""
        approval = await self._journal.approval(approval_id)
        if approval is None:
            return 404, f"no approval {approval_id}", None
        if approval.status != "pending":
            by_whom = f" by {approval.decided_by}" if approval.decided_by else ""
            return 409, f"approval {approval_id} is {approval.status}{by_whom}, not pending", approval
        now = self._clock()
        if approval.deadline <= now:
            return 409, f"approval {approval_id} passed its deadline {_iso(approval.deadline)}", approval
        decision = await self._journal.decision(approval.decision_id)
        policy = next((p for p in self.state.policies.policies if p.name == approval.policy), None)
        plan = journaled_plan(decision.plan) if decision is not None else None
        if decision is None or plan is None or policy is None \
                or [s.action for s in plan.steps] != [b.kind for b in policy.actions]:
            return 409, (f"approval {approval_id}: policy {approval.policy} is gone or now runs other actions; "
                         "the plan is left unapplied"), approval
        async with self._locks[policy.target.key]:
            frozen = (GuardDecision(False, "global freeze is on (config)") if self.state.frozen
                      else await self._frozen(policy, now))
            if frozen is not None:
                return 409, f"approval {approval_id} stays pending: {frozen.reason}", approval
            approved = await self._journal.approve(approval_id, by, reason, now)
            if approved is None:  # expired or approved by someone else meanwhile
                return 409, f"approval {approval_id} is no longer pending", approval
        self._on_recorded()
        log.info("plan approved", approval=approval_id, by=by, reason=reason, decision=approved.decision_id)
        self._send(approval_event("approved", approved, self.approval_base_url,
                                  f"approval {approval_id} approved by {by}: {reason}; applying", by=by))
        stored = await self._journal.signal(decision.signal_id)
        task = asyncio.create_task(self._run_approved(approved, policy, plan, stored.payload if stored else None),
                                   name=f"approved-{approval_id}")
        self._approved.add(task)
        task.add_done_callback(self._approved.discard)
        return 202, f"approval {approval_id} approved by {by}; applying decision {approved.decision_id}", approved

    async def _run_approved(self, approval: Approval, policy: LoadedPolicy, plan: Plan,
                            summary: Mapping[str, Any] | None, progress: Mapping[int, StepProgress] | None = None) -> None:
        signal = Signal.from_summary(dict(summary)) if summary is not None else None
        if signal is None:  # pruned: apply the plan, no recovery check (it needs the signal)
            signal = Signal.from_summary({"source": "alert", "name": "approved", "labels": {},
                                          "dedup_key": plan.signal_key, "observed_at": _iso(self._clock())})
        with structlog.contextvars.bound_contextvars(policy=policy.name, target=policy.target.key,
                                                     approval=approval.id):
            async with self._locks[policy.target.key]:
                await self._finish(approval.decision_id, policy, plan, progress or {}, signal)

    async def resume_approved(self) -> int:
        """Go on with approved plans a restart interrupted (decision still `executing`); how many."""
        started = 0
        for approval in await self._journal.approvals("approved"):
            decision = await self._journal.decision(approval.decision_id)
            if decision is None or decision.state is not DecisionState.EXECUTING:
                continue
            if any(t.get_name() == f"approved-{approval.id}" for t in self._approved):
                continue
            policy = next((p for p in self.state.policies.policies if p.name == approval.policy), None)
            plan = journaled_plan(decision.plan)
            if policy is None or [s.action for s in plan.steps] != [b.kind for b in policy.actions]:
                await self._journal.finish_decision(decision.id, DecisionState.FAILED,
                                                    f"approved plan not resumed after restart: policy "
                                                    f"{approval.policy} is gone or now runs other actions")
                continue
            progress = step_progress(await self._journal.steps(decision.id))
            stored = await self._journal.signal(decision.signal_id)
            task = asyncio.create_task(
                self._run_approved(approval, policy, plan, stored.payload if stored else None, progress),
                name=f"approved-{approval.id}")
            self._approved.add(task)
            task.add_done_callback(self._approved.discard)
            started += 1
        return started

    async def wait_approved(self) -> None:
        """Wait until every approved plan being applied now has finished (tests, demo)."""
        while self._approved:
            await asyncio.wait(set(self._approved))

    def _send(self, event: Mapping[str, Any]) -> None:
        try:
            self._notify(event)
        except Exception as exc:  # a notification never fails the caller
            self._metrics.faults.labels("notifications").inc()
            log.warning("could not hand over notification", error=repr(exc))

    async def _plan_steps(self, policy: LoadedPolicy, signal: Signal) -> list[Step]:
        steps = []
        for bound in policy.actions:
            action = self._action(bound.kind)
            try:
                observed = await _guarded(action.observe(policy.target, bound.params), bound.kind, "observe")
            except UnexpectedError:
                self._metrics.faults.labels("actions").inc()
                raise
            try:
                steps.append(action.plan(policy.target, bound.params, observed, signal))
            except ActionError:
                raise
            except Exception as exc:  # a planning bug is this decision's failure, not the worker's
                self._metrics.faults.labels("actions").inc()
                log.exception("plan raised", action=bound.kind)
                raise ActionError(f"{bound.kind}.plan raised {type(exc).__name__}: {exc}") from exc
        return steps

    async def _decide(self, signal_id: int, policy: LoadedPolicy, plan: Plan, state: DecisionState, reason: str,
                      executed: bool, extra: Mapping[str, Any] | None = None) -> int:
        """Journal the decision; `extra` keys go into its journaled plan (shadow, silences)."""
        decision_id = await self._journal.record_decision(
            signal_id, policy.name, policy.target.key, state, reason, {**plan.as_dict(), **(extra or {})}, executed)
        if state.final:
            self._metrics.decisions.labels(policy.name, state).inc()
        log.info("decision", state=state, reason=reason, plan=[s.summary for s in plan.steps],
                 dry_run=plan.dry_run)
        return decision_id

    async def _execute(self, decision_id: int, policy: LoadedPolicy, plan: Plan,
                       progress: Mapping[int, StepProgress]) -> tuple[DecisionState, str]:
        """Run the plan's steps; `progress` holds what a resumed decision's steps did before (else empty)."""
        applied: list[tuple[int, Step]] = []
        notify_failed: list[int] = []
        for idx, (bound, planned) in enumerate(zip(policy.actions, plan.steps)):
            done = progress.get(idx)
            if planned.noop:
                if done is None:
                    await self._journal.record_step(decision_id, idx, bound.kind, "apply", "noop",
                                                    planned.summary, planned.as_dict(), 0.0)
                continue
            step = replace(planned, effect_key=effect_key(decision_id, idx))
            final = done.final() if done is not None else None
            if done is not None and final is not None:
                # Finished before the restart: not called again.
                outcome, landed = final, done.landed
                log.info("step finished before the restart", action=bound.kind, idx=idx, result=outcome.status)
                await self._remember_pin(decision_id, policy, outcome)
            else:
                if not self._may_act():
                    # Lost leadership (or frozen) between steps: stop before conflicting with the new leader.
                    return DecisionState.FAILED, f"stopped before step {idx}: this replica may no longer act"
                outcome, landed = await self._apply_and_verify(decision_id, idx, bound.kind, step, policy,
                                                               bound.params, done)
                await self._event(policy, "Remediated" if outcome.ok else "RemediationFailed",
                                  f"{bound.kind}: {step.summary}: {outcome.message}", warning=not outcome.ok)
            if landed:
                # Applied, even if verify then failed: the change is in place and revert must undo it.
                applied.append((idx, step))
            if not outcome.ok and bound.kind == NOTIFY_KIND:
                notify_failed.append(idx)  # journaled failed; a notification never stops a remediation
                continue
            if not outcome.ok:
                failed = f"step {idx} ({bound.kind}) failed: {outcome.message}"
                if policy.spec.guards.on_failure == "revert" and applied:
                    not_reverted = await self._revert(decision_id, policy, applied, progress)
                    if not_reverted:
                        return DecisionState.FAILED, f"{failed}; revert failed for step(s) {not_reverted}"
                    return DecisionState.REVERTED, f"{failed}; reverted"
                return DecisionState.FAILED, failed
        finished = f"{len(applied)} step(s) applied and verified"
        if notify_failed:
            finished += f"; notify step(s) {notify_failed} failed (a notification never stops a plan)"
        return DecisionState.SUCCEEDED, finished

    async def _apply_and_verify(self, decision_id: int, idx: int, kind: str, step: Step, policy: LoadedPolicy,
                                params: Any, done: StepProgress | None) -> tuple[Outcome, bool]:
        """The step's final Outcome, and whether its apply landed (so a revert must undo it).

        `done`: what the step did before a restart (None: nothing). Applied: only verify is left.
        In doubt (an intent without result): verify first, and apply again only when that is not OK.
        """
        action = self._action(kind)
        started = time.monotonic()
        applied: Outcome | None = None
        verified: Outcome | None = None
        if done is not None and done.landed:
            applied = Outcome.success("applied before the restart")
        elif done is not None and done.in_doubt:
            check = await self._call(action.verify(step, policy.target, params), kind, "verify")
            if check.status is OutcomeStatus.OK:
                applied = verified = check
                await self._journal.record_step(
                    decision_id, idx, kind, "apply", OutcomeStatus.OK.value,
                    f"recovered after restart: attempt {done.attempt} had landed ({check.message})",
                    {"step": step.as_dict(), "attempt": done.attempt, "effect_key": step.effect_key,
                     "recovered": True}, time.monotonic() - started)
            else:
                log.info("step in doubt after restart is not in place; applying it", action=kind, idx=idx,
                         observed=check.message)
        if applied is None:
            applied = await self._apply(decision_id, idx, kind, step, policy, params,
                                        done.attempt + 1 if done is not None else 1, started)
        outcome, landed = applied, applied.ok
        if landed:
            outcome = verified or await self._call(action.verify(step, policy.target, params), kind, "verify")
            await self._journal.record_step(decision_id, idx, kind, "verify", outcome.status.value,
                                            outcome.message, dict(outcome.data), time.monotonic() - started)
        result = "succeeded" if outcome.ok else "failed"
        self._metrics.actions.labels(kind, result).inc()
        self._metrics.action_duration.labels(kind).observe(time.monotonic() - started)
        log.info("step", action=kind, idx=idx, result=result, message=outcome.message,
                 summary=step.summary)
        await self._remember_pin(decision_id, policy, outcome)
        return outcome, landed

    async def _apply(self, decision_id: int, idx: int, kind: str, step: Step, policy: LoadedPolicy,
                     params: Any, first: int, started: float) -> Outcome:
        """Apply from attempt `first` while retryable, up to MAX_APPLY_ATTEMPTS (at least once);
        each attempt's intent journaled before the call and its result after.

        Between attempts: the backoff (1 s, 2 s, 4 s ...) or the wait the failure asked for
        (`TemporaryError.delay_seconds`), whichever is longer; a failure that asks for more than
        MAX_RETRY_DELAY_SECONDS is not retried. An exception that is no ActionError is a bug, not a
        transient failure: the step fails at once (`_call`)."""
        action = self._action(kind)
        last = max(first, MAX_APPLY_ATTEMPTS)
        outcome = Outcome.failure("not attempted")
        for attempt in range(first, last + 1):
            attempted = {"step": step.as_dict(), "attempt": attempt, "effect_key": step.effect_key}
            await self._journal.record_step(decision_id, idx, kind, INTENT, "pending",
                                            f"attempt {attempt}: {step.summary}", attempted, None)
            outcome = await self._call(action.apply(step, policy.target, params), kind, "apply")
            delay = _retry_delay(attempt, outcome)
            if not outcome.ok and outcome.retryable and attempt < last and delay > MAX_RETRY_DELAY_SECONDS:
                outcome = Outcome(outcome.status, f"{outcome.message}; not retried: it asks to wait {delay:g}s, "
                                                  f"more than {MAX_RETRY_DELAY_SECONDS:g}s", False, outcome.data)
            await self._journal.record_step(decision_id, idx, kind, "apply", outcome.status.value, outcome.message,
                                            {**attempted, "retryable": outcome.retryable, **dict(outcome.data)},
                                            time.monotonic() - started)
            if outcome.ok or not outcome.retryable or attempt == last:
                break
            await self._sleep(delay)
        return outcome

    async def _call(self, coro: Awaitable[Outcome], kind: str, phase: str) -> Outcome:
        """An action's apply, verify or revert as an Outcome; an exception that is no ActionError
        (logged with its traceback by `_guarded`) is counted as a fault and fails, not retryable."""
        outcome = await _outcome(coro, kind, phase)
        if UNEXPECTED in outcome.data:
            self._metrics.faults.labels("actions").inc()
        return outcome

    async def _remember_pin(self, decision_id: int, policy: LoadedPolicy, outcome: Outcome) -> None:
        """Journal the version a verified rollback pinned (`pin` in its data), for new replicas, with
        why (the decision, its signal, the plan's reason) and the version rolled back from (marked bad)."""
        pin = outcome.data.get("pin") if outcome.ok else None
        if pin:
            from_version = pin.get("from_version")
            await self._journal.record_pin(
                policy.target.key, pin["model"], int(pin["version"]),
                from_version=int(from_version) if from_version is not None else None,
                decision_id=decision_id, reason=str(pin.get("reason", "")), policy=policy.name)
            self._on_recorded()

    async def _revert(self, decision_id: int, policy: LoadedPolicy, applied: list[tuple[int, Step]],
                      progress: Mapping[int, StepProgress]) -> list[int]:
        """Undo `applied` in reverse order, except what was reverted before a restart; the indexes
        whose revert failed (their change may remain)."""
        failed = []
        for idx, step in reversed(applied):
            if idx in progress and progress[idx].reverted:
                continue
            bound = policy.actions[idx]
            outcome = await self._call(self._action(bound.kind).revert(step, policy.target, bound.params),
                                       bound.kind, "revert")
            await self._journal.record_step(decision_id, idx, bound.kind, "revert", outcome.status.value,
                                            outcome.message, dict(outcome.data), None)
            self._metrics.actions.labels(bound.kind, "reverted" if outcome.ok else "revert_failed").inc()
            if not outcome.ok:
                failed.append(idx)
        return failed

    # ---- recovery --------------------------------------------------------------------------------

    async def resume_verifications(self) -> int:
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

    async def wait_recoveries(self) -> None:
        """Wait until every recovery watch running now has settled (tests, demo)."""
        while self._recoveries:
            await asyncio.wait(set(self._recoveries.values()))

    async def close(self) -> None:
        """Stop the recovery watches and approved plans being applied; what they did not settle stays
        in the journal (resumed at the next start)."""
        tasks = list(self._recoveries.values()) + list(self._approved)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._recoveries.clear()
        self._approved.clear()

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
        policy = next((p for p in self.state.policies.policies if p.name == policy_name), None)
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
        async with self._locks[decision.target]:
            rows = await self._journal.steps(decision_id)
            progress = step_progress(rows)
            applied = [(idx, replace(step, effect_key=effect_key(decision_id, idx)))
                       for idx, step in enumerate(plan.steps)
                       if not step.noop and idx in progress and progress[idx].landed]
            not_reverted = await self._revert(decision_id, policy, applied, progress)
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

    def _announce(self, event: str, policy: str, target: str, message: str, **extra: Any) -> None:
        """Hand an outcome event to `notify`; never blocks, never fails the caller."""
        try:
            self._notify({"event": event, "policy": policy, "target": target, "message": message,
                          "at": _iso(self._clock()), **extra})
        except Exception as exc:
            self._metrics.faults.labels("notifications").inc()
            log.warning("could not hand over notification", error=repr(exc))

    async def _event(self, policy: LoadedPolicy, reason: str, message: str, warning: bool) -> None:
        if self._deps.record_event is None:
            return
        try:
            await self._deps.record_event(policy=policy, reason=reason, message=message, warning=warning)
        except Exception as exc:  # an Event is a courtesy: its failure is recorded, never fatal
            self._metrics.faults.labels("events").inc()
            log.warning("could not record Kubernetes event", error=str(exc))


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="seconds")


def _until(until: float) -> str:
    return "" if until >= FOREVER else f" (until {_iso(until)})"


UNEXPECTED = "exception"  # Outcome data of a call that raised no ActionError: {"type", "message"}


class UnexpectedError(ActionError):
    """An action call raised an exception that is no ActionError: a bug (or an error the action
    did not classify), never retried: only an action knows a failure is transient and says so
    (TemporaryError, or a retryable Outcome)."""

    def __init__(self, kind: str, phase: str, exc: Exception) -> None:
        super().__init__(f"{kind}.{phase} raised {type(exc).__name__}: {exc}", retryable=False)
        self.error_type = type(exc).__name__
        self.error = str(exc)


async def _guarded(coro: Awaitable[T], kind: str, phase: str) -> T:
    """Await an action call; turn unexpected exceptions into UnexpectedError naming where it failed
    (logged with the traceback)."""
    try:
        return await coro
    except ActionError:
        raise
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a plugin bug or a client error must not kill the worker
        log.exception("action raised", action=kind, phase=phase, error_type=type(exc).__name__)
        raise UnexpectedError(kind, phase, exc) from exc


async def _outcome(coro: Awaitable[Outcome], kind: str, phase: str) -> Outcome:
    try:
        return await _guarded(coro, kind, phase)
    except UnexpectedError as exc:
        return Outcome(OutcomeStatus.FAILED, str(exc), retryable=False,
                       data={UNEXPECTED: {"type": exc.error_type, "message": exc.error}})
    except TemporaryError as exc:
        return Outcome(OutcomeStatus.FAILED, str(exc), retryable=exc.retryable,
                       data={RETRY_AFTER: exc.delay_seconds})
    except ActionError as exc:
        return Outcome(OutcomeStatus.FAILED, str(exc), retryable=exc.retryable)


def _retry_delay(attempt: int, outcome: Outcome) -> float:
    """The wait before the attempt after `attempt`: the backoff 2^(attempt-1) s, or longer when the
    failure asked for it (a finite `retry_after_seconds` in its data)."""
    backoff = float(2 ** (attempt - 1))
    asked = outcome.data.get(RETRY_AFTER)
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or not math.isfinite(asked):
        return backoff
    return max(backoff, float(asked))
