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
"""
from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Iterable, Mapping, TypeVar

import structlog

from actions.base import Action, ActionDeps, Step
from core.decision import DecisionState
from core.outcome import ActionError, Outcome, OutcomeStatus
from core.signal import Signal
from daemon.storage.journal import AsyncJournal, Decision
from daemon.common.metrics import Metrics
from policies.guards import GuardDecision, GuardState, check_guards
from policies.loader import LoadedPolicy, PolicySet
from policies.matching import matching_policies
from policies.planning import Plan, blocked_plan, build_plan

log = structlog.get_logger("tailguard.executor")

# The executor owns retries of transient failures (an Outcome marked retryable): up to this many
# applies per step. Actions retry nothing themselves except write conflicts, inside their
# compare-and-swap, and an exhausted conflict comes back not retryable.
MAX_APPLY_ATTEMPTS = 3
INTENT = "intent"  # the step row phase journaled before each apply call
T = TypeVar("T")


def effect_key(decision_id: int, idx: int) -> str:
    """The key of one step's effect (`Step.effect_key`): the same on every attempt and after a restart."""
    return f"{decision_id}/{idx}"


@dataclass
class StepProgress:
    """How far one step got, as its journaled rows say (what a resumed decision goes on from)."""

    attempt: int = 0  # the last attempt with an intent or a result
    in_doubt: bool = False  # that attempt's intent has no result: its call may or may not have landed
    result: Mapping[str, Any] | None = None  # the apply row of that attempt
    verify: Mapping[str, Any] | None = None  # the verify row after it
    reverted: bool = False  # a revert of it was recorded as done

    @property
    def landed(self) -> bool:
        return self.result is not None and self.result["status"] in (OutcomeStatus.OK, OutcomeStatus.NOOP)

    def final(self) -> Outcome | None:
        """The step's final Outcome when the journal already has it (nothing to call), else None."""
        if self.result is None or self.in_doubt:
            return None
        if self.landed:
            return _journaled_outcome(self.verify) if self.verify is not None else None
        if self.result["data"].get("retryable") and self.attempt < MAX_APPLY_ATTEMPTS:
            return None  # a retryable failure with attempts left: the retries go on
        return _journaled_outcome(self.result)


def step_progress(rows: Iterable[Mapping[str, Any]]) -> dict[int, StepProgress]:
    """Each step's progress (by index) from a decision's step rows, oldest first."""
    progress: dict[int, StepProgress] = {}
    for row in rows:
        step = progress.setdefault(int(row["idx"]), StepProgress())
        if row["phase"] == INTENT:
            step.attempt, step.in_doubt, step.result, step.verify = int(row["data"]["attempt"]), True, None, None
        elif row["phase"] == "apply":
            step.attempt, step.in_doubt, step.result = int(row["data"].get("attempt", step.attempt)), False, row
        elif row["phase"] == "verify":
            step.verify = row
        elif row["phase"] == "revert":
            step.reverted = row["status"] in (OutcomeStatus.OK, OutcomeStatus.NOOP)
    return progress


def _journaled_outcome(row: Mapping[str, Any]) -> Outcome:
    return Outcome(OutcomeStatus(row["status"]), row["message"], data=row["data"])


def _journaled_plan(plan: Mapping[str, Any]) -> Plan:
    """The Plan a decision journaled (`Plan.as_dict`)."""
    return Plan(plan["policy"], plan["target"], plan["signal"], tuple(Step.from_dict(s) for s in plan["steps"]),
                bool(plan["dry_run"]), plan.get("blocked"))


@dataclass
class ExecutorState:
    """What the executor reads at decision time; swapped by reload, leader election and the CLI."""

    policies: PolicySet
    frozen: bool = False


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
            return await self._resume(existing, policy)
        decision = await self._guard(policy)
        if not decision.allowed:
            plan = blocked_plan(policy, signal, decision)
            await self._decide(signal_id, policy, plan, DecisionState.BLOCKED, decision.reason, executed=False)
            return plan
        try:
            steps = await self._plan_steps(policy, signal)
        except ActionError as exc:
            plan = Plan(policy.name, policy.target.key, signal.dedup_key, (), policy.spec.guards.dry_run,
                        blocked=f"planning failed: {exc}")
            await self._decide(signal_id, policy, plan, DecisionState.FAILED, plan.blocked or "", executed=False)
            for bound in policy.actions:
                self._metrics.actions.labels(bound.kind, "failed").inc()
            await self._event(policy, "RemediationFailed", plan.blocked or "", warning=True)
            return plan
        plan = build_plan(policy, signal, steps)
        if plan.blocked:
            await self._decide(signal_id, policy, plan, DecisionState.NOOP, plan.blocked, executed=False)
            return plan
        if plan.dry_run:
            await self._decide(signal_id, policy, plan, DecisionState.DRY_RUN, "dryRun: planned, not applied",
                               executed=False)
            return plan
        # Journaled as executed before the first write: a crash mid-way still counts for cooldown.
        decision_id = await self._decide(signal_id, policy, plan, DecisionState.EXECUTING, "applying",
                                         executed=True)
        self._on_recorded()
        await self._finish(decision_id, policy, plan, {})
        return plan

    async def _resume(self, decision: Decision, policy: LoadedPolicy) -> Plan:
        """Go on with a decision left `executing` by a crash, from its journaled plan and steps."""
        plan = _journaled_plan(decision.plan)
        planned, kinds = [s.action for s in plan.steps], [bound.kind for bound in policy.actions]
        if planned != kinds:
            reason = (f"not resumed after restart: policy {policy.name} now runs {kinds}, the journaled plan "
                      f"{planned}; steps applied before the restart are left as they are")
            await self._journal.finish_decision(decision.id, DecisionState.FAILED, reason)
            self._metrics.decisions.labels(policy.name, DecisionState.FAILED).inc()
            log.warning("decision not resumed", decision=decision.id, reason=reason)
            return plan
        log.info("resuming decision after restart", decision=decision.id, plan=[s.summary for s in plan.steps])
        await self._finish(decision.id, policy, plan, step_progress(await self._journal.steps(decision.id)))
        return plan

    async def _finish(self, decision_id: int, policy: LoadedPolicy, plan: Plan,
                      progress: Mapping[int, StepProgress]) -> None:
        state, reason = await self._execute(decision_id, policy, plan, progress)
        await self._journal.finish_decision(decision_id, state, reason)
        self._metrics.decisions.labels(policy.name, state).inc()
        log.info("plan finished", state=state, reason=reason)

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

    async def _guard(self, policy: LoadedPolicy) -> GuardDecision:
        last, count = await self._journal.guard_history(
            policy.name, policy.target.key, policy.spec.guards.max_actions_window, self._clock())
        return check_guards(policy.spec.guards, GuardState(last, count, self.state.frozen), self._clock())

    async def _plan_steps(self, policy: LoadedPolicy, signal: Signal) -> list[Step]:
        steps = []
        for bound in policy.actions:
            action = self._action(bound.kind)
            observed = await _guarded(action.observe(policy.target, bound.params), bound.kind, "observe")
            try:
                steps.append(action.plan(policy.target, bound.params, observed, signal))
            except ActionError:
                raise
            except Exception as exc:  # a planning bug is this decision's failure, not the worker's
                log.exception("plan raised", action=bound.kind)
                raise ActionError(f"{bound.kind}.plan raised {type(exc).__name__}: {exc}") from exc
        return steps

    async def _decide(self, signal_id: int, policy: LoadedPolicy, plan: Plan, state: DecisionState, reason: str,
                      executed: bool) -> int:
        decision_id = await self._journal.record_decision(
            signal_id, policy.name, policy.target.key, state, reason, plan.as_dict(), executed)
        if state.final:
            self._metrics.decisions.labels(policy.name, state).inc()
        log.info("decision", state=state, reason=reason, plan=[s.summary for s in plan.steps],
                 dry_run=plan.dry_run)
        return decision_id

    async def _execute(self, decision_id: int, policy: LoadedPolicy, plan: Plan,
                       progress: Mapping[int, StepProgress]) -> tuple[DecisionState, str]:
        """Run the plan's steps; `progress` holds what a resumed decision's steps did before (else empty)."""
        applied: list[tuple[int, Step]] = []
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
                await self._remember_pin(policy, outcome)
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
            if not outcome.ok:
                failed = f"step {idx} ({bound.kind}) failed: {outcome.message}"
                if policy.spec.guards.on_failure == "revert" and applied:
                    not_reverted = await self._revert(decision_id, policy, applied, progress)
                    if not_reverted:
                        return DecisionState.FAILED, f"{failed}; revert failed for step(s) {not_reverted}"
                    return DecisionState.REVERTED, f"{failed}; reverted"
                return DecisionState.FAILED, failed
        return DecisionState.SUCCEEDED, f"{len(applied)} step(s) applied and verified"

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
            check = await _outcome(action.verify(step, policy.target, params), kind, "verify")
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
            outcome = verified or await _outcome(action.verify(step, policy.target, params), kind, "verify")
            await self._journal.record_step(decision_id, idx, kind, "verify", outcome.status.value,
                                            outcome.message, dict(outcome.data), time.monotonic() - started)
        result = "succeeded" if outcome.ok else "failed"
        self._metrics.actions.labels(kind, result).inc()
        self._metrics.action_duration.labels(kind).observe(time.monotonic() - started)
        log.info("step", action=kind, idx=idx, result=result, message=outcome.message,
                 summary=step.summary)
        await self._remember_pin(policy, outcome)
        return outcome, landed

    async def _apply(self, decision_id: int, idx: int, kind: str, step: Step, policy: LoadedPolicy,
                     params: Any, first: int, started: float) -> Outcome:
        """Apply from attempt `first` while retryable, up to MAX_APPLY_ATTEMPTS (at least once);
        each attempt's intent journaled before the call and its result after."""
        action = self._action(kind)
        last = max(first, MAX_APPLY_ATTEMPTS)
        outcome = Outcome.failure("not attempted")
        for attempt in range(first, last + 1):
            attempted = {"step": step.as_dict(), "attempt": attempt, "effect_key": step.effect_key}
            await self._journal.record_step(decision_id, idx, kind, INTENT, "pending",
                                            f"attempt {attempt}: {step.summary}", attempted, None)
            outcome = await _outcome(action.apply(step, policy.target, params), kind, "apply")
            await self._journal.record_step(decision_id, idx, kind, "apply", outcome.status.value, outcome.message,
                                            {**attempted, "retryable": outcome.retryable, **dict(outcome.data)},
                                            time.monotonic() - started)
            if outcome.ok or not outcome.retryable or attempt == last:
                break
            await self._sleep(2 ** (attempt - 1))
        return outcome

    async def _remember_pin(self, policy: LoadedPolicy, outcome: Outcome) -> None:
        """Journal the version a verified rollback pinned (`pin` in its data), for new replicas."""
        pin = outcome.data.get("pin") if outcome.ok else None
        if pin:
            await self._journal.record_pin(policy.target.key, pin["model"], int(pin["version"]))
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
            outcome = await _outcome(self._action(bound.kind).revert(step, policy.target, bound.params),
                                     bound.kind, "revert")
            await self._journal.record_step(decision_id, idx, bound.kind, "revert", outcome.status.value,
                                            outcome.message, dict(outcome.data), None)
            self._metrics.actions.labels(bound.kind, "reverted" if outcome.ok else "revert_failed").inc()
            if not outcome.ok:
                failed.append(idx)
        return failed

    async def _event(self, policy: LoadedPolicy, reason: str, message: str, warning: bool) -> None:
        if self._deps.record_event is None:
            return
        try:
            await self._deps.record_event(policy=policy, reason=reason, message=message, warning=warning)
        except Exception as exc:  # an Event is a courtesy: its failure is recorded, never fatal
            self._metrics.faults.labels("events").inc()
            log.warning("could not record Kubernetes event", error=str(exc))


async def _guarded(coro: Awaitable[T], kind: str, phase: str) -> T:
    """Await an action call; turn unexpected exceptions into ActionError naming where it failed."""
    try:
        return await coro
    except ActionError:
        raise
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a plugin bug or a client error must not kill the worker
        log.exception("action raised", action=kind, phase=phase)
        raise ActionError(f"{kind}.{phase} raised {type(exc).__name__}: {exc}", retryable=True) from exc


async def _outcome(coro: Awaitable[Outcome], kind: str, phase: str) -> Outcome:
    try:
        return await _guarded(coro, kind, phase)
    except ActionError as exc:
        return Outcome(OutcomeStatus.FAILED, str(exc), retryable=exc.retryable)
