"""The executor: journaled signal -> matching policies -> guards -> observe -> plan -> apply/verify.

One lock per target: events for one target run in order, different targets in parallel.
Everything except cancellation becomes an Outcome in the journal.

This module decides (guards, freezes, silences, shadow triggers, approvals) and runs a decision's plan
through `steps.StepRunner` (intent, apply, verify, retry, revert: how each step is journaled and
retried is described there). A plan that succeeded has its recovery check journaled as in flight with
the decision's final state and watched by `recovery_watch.RecoveryWatches` (verdicts, onNotRecovered).

A decision found `executing` after a restart is resumed, never re-planned: its journaled plan (with the
true `before` a revert needs) and step rows say how far each step got. Outcomes (acted, failed,
recovered, not_recovered, escalated) go to `notify`, a callback that never blocks.
"""
from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Mapping

import structlog

from actions.base import Action, ActionDeps, Step
from core.decision import DecisionState
from core.outcome import ActionError
from core.signal import Signal, SignalSource
from daemon.common.config import BlastRadiusSettings
from daemon.common.metrics import Metrics
from daemon.storage.journal import DAEMON_SCOPE, FOREVER, RECOVERY, Approval, AsyncJournal, Decision
from daemon.workers.approvals import approval_event
from daemon.workers.blast_guard import BlastGuard, escalates
from daemon.workers.progress import StepProgress, journaled_plan, step_progress
from daemon.workers.recovery_watch import RecoveryWatches
from daemon.workers.shadow import ShadowOrigin, shadow_origin
from daemon.workers.silences import SilenceCheck, describe_all, target_labels
from daemon.workers.state import ExecutorState
from daemon.workers.steps import StepRunner, UnexpectedError, guarded
from daemon.workers.verifier import RangeFn
from policies.guards import GuardDecision, GuardState, check_guards
from policies.loader import LoadedPolicy
from policies.matching import matching_policies
from policies.planning import Plan, RecoveryCheck, blocked_plan, build_plan, recovery_check, unplanned


log = structlog.get_logger("tailguard.executor")

Notify = Callable[[Mapping[str, Any]], None]  # an outcome event to send; returns at once, never blocks


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
        self._clock = clock
        self._on_recorded = on_recorded  # an executed plan or a pin was journaled (cluster state)
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._actions: dict[str, Action] = {}
        self._notify = notify
        self._blast = BlastGuard(journal, state, blast_radius or BlastRadiusSettings(), clock, sleep)
        # Running a decision's steps, and watching its recovery after: each in a class of its own.
        self._steps = StepRunner(journal, metrics, self._action, self._event, may_act, sleep, on_recorded)
        self._watches = RecoveryWatches(journal, state, self._steps, deps, metrics, self.lock_for, may_act, clock,
                                        sleep, on_recorded, self._announce, escalation_freeze_seconds)
        self.approval_base_url = approval_base_url  # named in approval notifications
        self._approved: set[asyncio.Task[None]] = set()  # approved plans being applied
        # Asks Alertmanager whether a silence covers a detector signal's target; set by connect when
        # alertmanager.url is configured (None: no silences are consulted).
        self.silences: SilenceCheck | None = None

    def lock_for(self, target_key: str) -> asyncio.Lock:
        """The lock that keeps one actor at a time on a target (shared with the pin reconciler)."""
        return self._locks[target_key]

    # The watches read these; kept as the Executor's attributes (connect sets query_range here).
    @property
    def query_range(self) -> RangeFn | None:
        """Reads back what a watch resumed after a restart missed (Prometheus range query)."""
        return self._watches.query_range

    @query_range.setter
    def query_range(self, query_range: RangeFn | None) -> None:
        self._watches.query_range = query_range

    @property
    def escalation_freeze_seconds(self) -> float:
        """How long onNotRecovered: escalate freezes the target."""
        return self._watches.escalation_freeze_seconds

    @escalation_freeze_seconds.setter
    def escalation_freeze_seconds(self, seconds: float) -> None:
        self._watches.escalation_freeze_seconds = seconds

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
            plan = unplanned(policy, signal, exc)
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
            plan = unplanned(policy, signal, exc)
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
        state, reason = await self._steps.run_plan(decision_id, policy, plan, progress)
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
            self._watches.start(decision_id, policy.name, policy.target.key, check, acted_at)
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
                plans.append(unplanned(policy, signal, exc))
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
                observed = await guarded(action.observe(policy.target, bound.params), bound.kind, "observe")
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

    # ---- recovery --------------------------------------------------------------------------------

    async def resume_verifications(self) -> int:
        """Go on with every recovery the journal says is unsettled (a restart): watches in flight
        (with what they missed read back) and reverts a verdict asked for that did not finish.
        Returns how many were started; ones already running are left alone (safe to call again,
        e.g. when this replica becomes the leader). Raises JournalError when the journal cannot be read."""
        return await self._watches.resume()

    async def wait_recoveries(self) -> None:
        """Wait until every recovery watch running now has settled (tests, demo)."""
        await self._watches.wait()

    async def close(self) -> None:
        """Stop the recovery watches and approved plans being applied; what they did not settle stays
        in the journal (resumed at the next start)."""
        approved = list(self._approved)
        for task in approved:
            task.cancel()
        await self._watches.close()
        await asyncio.gather(*approved, return_exceptions=True)
        self._approved.clear()

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

