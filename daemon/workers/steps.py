"""Running a decision's plan step by step for the executor: intent, apply, verify, retry, revert.

Every apply is journaled twice: its intent before the call (phase "intent": the step, the attempt,
the effect key "<decision id>/<step index>" that the action marks its change with) and its result
after. A decision resumed after a restart goes on from its step rows: a step with a final result is
not called again (an applied one still counts for revert); a step whose intent has no result is
re-observed first: when `verify` answers OK its change had landed and it is recorded as applied
(recovered after restart), else it is applied again; a step never started is applied as usual.
Delivery per action: docs/design-notes.md.

Retries: only a transient failure (a TemporaryError, or an Outcome marked retryable) is applied again,
up to MAX_APPLY_ATTEMPTS, after the backoff (1 s, 2 s ...) or the TemporaryError's `delay_seconds`,
whichever is longer (a failure asking for more than MAX_RETRY_DELAY_SECONDS fails the step). An
exception that is no ActionError is a bug, never retried: its step fails at once, journaled with the
exception's type and message, counted in tailguard_faults_total{component="actions"} and logged with
its traceback; onFailure follows as for any failed step.

An advisory step (`Action.advisory`: notify) never stops a plan: when it fails it is journaled
failed and the plan goes on.

Every apply runs as writer "executor" and every revert as writer "revert" of its decision
(`daemon.workers.door.acting`): each write the action makes passes the door, which asks freezes,
leadership and bad marks at that moment; a write it refuses fails the step, not retried.

With sharding on (`owns`), a replica that no longer leads the target's shard before a step, or
whose apply or revert failed meanwhile (the door refuses it), stops with ShardFenced and journals
nothing more: the decision stays `executing` and its signal pending, for the shard's new leader to
resume from the step rows (an intent without result is re-observed first). A `failed` end here would
be final, and no replica would act on the signal again.
"""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Mapping, TypeVar

import structlog

from actions.base import Action, Preconditions, Step
from core.decision import DecisionState
from core.outcome import ActionError, Outcome, OutcomeStatus, TemporaryError
from daemon.storage.records import StepRecord
from daemon.storage.shard_terms import ShardFenced
from daemon.storage.step_kinds import StepPhase, StepStatus
from daemon.workers.context import ActContext
from daemon.workers.door import EXECUTOR, REVERT, acting
from daemon.workers.progress import MAX_APPLY_ATTEMPTS, StepProgress
from policies.loader import LoadedPolicy
from policies.planning import Plan

log = structlog.get_logger("tailguard.executor")  # the executor's log: steps are its work

T = TypeVar("T")
MAX_RETRY_DELAY_SECONDS = 60.0
"""The longest wait before a retry of an apply (the target stays locked meanwhile): an action that
asks for more (`TemporaryError.delay_seconds`) has its step failed instead of retried."""
RETRY_AFTER = "retry_after_seconds"  # Outcome data: the least wait a transient failure asks for
REAPPLY = "reapply"  # verify's Outcome data: the apply may settle what is not in place yet (apply again)


def effect_key(decision_id: int, idx: int) -> str:
    """The key of one step's effect (`Step.effect_key`): the same on every attempt and after a restart."""
    return f"{decision_id}/{idx}"


ActionFor = Callable[[str], Action]  # the action instance for a kind (the executor keeps one per kind)
RecordEvent = Callable[[LoadedPolicy, str, str, bool], Awaitable[None]]  # policy, reason, message, warning


class StepRunner:
    """Applies, verifies and reverts a decision's steps, journaling each call; the caller holds the
    target's lock."""

    def __init__(self, ctx: ActContext, action: ActionFor, event: RecordEvent) -> None:
        # The executor's plumbing: its journal, metrics, leadership, sleep (between apply attempts),
        # on_recorded (a pin was journaled: cluster state).
        self._ctx = ctx
        self._action = action
        self._event = event  # a Kubernetes Event per applied step; never fails the plan
        # Sharding: whether this replica leads a target's shard now (None: one leader for every target).
        self.owns: Callable[[str], bool] | None = None

    def _still_leads(self, target: str, where: str) -> None:
        """Sharding: raise ShardFenced when this replica no longer leads `target`'s shard, leaving the
        decision as journaled so far (`executing`) to the shard's new leader."""
        if self.owns is not None and not self.owns(target):
            log.warning("shard lost mid-decision; decision left executing for the shard's new leader",
                        where=where)
            raise ShardFenced(f"{where}: this replica no longer leads the shard of {target}; the decision is "
                              "left executing for the shard's new leader")

    async def run_plan(self, decision_id: int, policy: LoadedPolicy, plan: Plan,
                       progress: Mapping[int, StepProgress]) -> tuple[DecisionState, str]:
        """Run the plan's steps; `progress` holds what a resumed decision's steps did before (else empty).
        The decision's end state and reason (onFailure: revert already followed)."""
        applied: list[tuple[int, Step]] = []
        notify_failed: list[int] = []
        for idx, (bound, planned) in enumerate(zip(policy.actions, plan.steps)):
            done = progress.get(idx)
            if planned.noop:
                if done is None:
                    await self._ctx.journal.decisions.record_step.in_thread(StepRecord(
                        decision_id, idx, bound.kind, StepPhase.APPLY, StepStatus.NOOP, planned.summary,
                        planned.as_dict(), 0.0))
                continue
            step = replace(planned, effect_key=effect_key(decision_id, idx))
            final = done.final() if done is not None else None
            if done is not None and final is not None:
                # Finished before the restart: not called again.
                outcome, landed = final, done.landed
                log.info("step finished before the restart", action=bound.kind, idx=idx, result=outcome.status)
                await self._remember_pin(decision_id, policy, outcome)
            else:
                self._still_leads(policy.target.key, f"stopped before step {idx}")
                if not self._ctx.may_act():
                    # Lost leadership (or frozen) between steps: stop before conflicting with the new leader.
                    return DecisionState.FAILED, f"stopped before step {idx}: this replica may no longer act"
                outcome, landed = await self._apply_and_verify(decision_id, idx, bound.kind, step, policy,
                                                               bound.params, done)
                await self._event(policy, "Remediated" if outcome.ok else "RemediationFailed",
                                  f"{bound.kind}: {step.summary}: {outcome.message}", not outcome.ok)
            if landed:
                # Applied, even if verify then failed: the change is in place and revert must undo it.
                applied.append((idx, step))
            if not outcome.ok and self._action(bound.kind).advisory:
                notify_failed.append(idx)  # journaled failed; a notification never stops a remediation
                continue
            if not outcome.ok:
                failed = f"step {idx} ({bound.kind}) failed: {outcome.message}"
                if policy.spec.guards.on_failure == "revert" and applied:
                    not_reverted = await self.revert(decision_id, policy, applied, progress)
                    if not_reverted:
                        return DecisionState.FAILED, f"{failed}; revert failed for step(s) {not_reverted}"
                    return DecisionState.REVERTED, f"{failed}; reverted"
                return DecisionState.FAILED, failed
        finished = f"{len(applied)} step(s) applied and verified"
        if notify_failed:
            finished += f"; notify step(s) {notify_failed} failed (a notification never stops a plan)"
        return DecisionState.SUCCEEDED, finished

    async def changed_since_plan(self, decision_id: int, policy: LoadedPolicy, plan: Plan,
                                 progress: Mapping[int, StepProgress]) -> str | None:
        """Before a resumed decision goes on: why it must not (a step still to apply or re-verify
        whose action offers `Preconditions` and finds the target changed since the plan), else None.
        Steps with a final result are not asked; neither is an action without preconditions."""
        for idx, (bound, planned) in enumerate(zip(policy.actions, plan.steps)):
            done = progress.get(idx)
            if planned.noop or (done is not None and done.final() is not None):
                continue
            action = self._action(bound.kind)
            if not isinstance(action, Preconditions):
                continue
            step = replace(planned, effect_key=effect_key(decision_id, idx))
            held = await self._call(action.preconditions(step, policy.target, bound.params), bound.kind,
                                    "preconditions")
            if not held.ok:
                details = held.data.get("changed")
                return f"step {idx} ({bound.kind}): {held.message}" + (f": {details}" if details else "")
        return None

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
                await self._ctx.journal.decisions.record_step.in_thread(StepRecord(
                    decision_id, idx, kind, StepPhase.APPLY, StepStatus.OK,
                    f"recovered after restart: attempt {done.attempt} had landed ({check.message})",
                    {"step": step.as_dict(), "attempt": done.attempt, "effect_key": step.effect_key,
                     "recovered": True}, time.monotonic() - started))
            else:
                log.info("step in doubt after restart is not in place; applying it", action=kind, idx=idx,
                         observed=check.message)
        last = done.attempt if done is not None else 0
        if applied is None:
            applied, last = await self._apply(decision_id, idx, kind, step, policy, params, last + 1, started)
        outcome, landed = applied, applied.ok
        while landed:
            outcome = verified or await self._call(action.verify(step, policy.target, params), kind, "verify")
            verified = None
            await self._ctx.journal.decisions.record_step.in_thread(StepRecord(
                decision_id, idx, kind, StepPhase.VERIFY, StepStatus(outcome.status.value), outcome.message,
                dict(outcome.data), time.monotonic() - started))
            if outcome.ok or not outcome.data.get(REAPPLY) or last >= MAX_APPLY_ATTEMPTS:
                break
            # Verify found a part of the target the apply could not settle (a replica back on the old
            # version): the apply runs again, within the same attempts, then verify again.
            log.info("verify asks to apply again", action=kind, idx=idx, observed=outcome.message)
            await self._ctx.sleep(_retry_delay(last, outcome))
            again, last = await self._apply(decision_id, idx, kind, step, policy, params, last + 1, started)
            if not again.ok:
                outcome = again  # landed stays: the earlier apply's change is in place (a revert undoes it)
                break
        result = "succeeded" if outcome.ok else "failed"
        self._ctx.metrics.actions.labels(kind, result).inc()
        self._ctx.metrics.action_duration.labels(kind).observe(time.monotonic() - started)
        log.info("step", action=kind, idx=idx, result=result, message=outcome.message,
                 summary=step.summary)
        await self._remember_pin(decision_id, policy, outcome)
        return outcome, landed

    async def _apply(self, decision_id: int, idx: int, kind: str, step: Step, policy: LoadedPolicy,
                     params: Any, first: int, started: float) -> tuple[Outcome, int]:
        """Apply from attempt `first` while retryable, up to MAX_APPLY_ATTEMPTS (at least once);
        each attempt's intent journaled before the call and its result after.

        Between attempts: the backoff (1 s, 2 s, 4 s ...) or the wait the failure asked for
        (`TemporaryError.delay_seconds`), whichever is longer; a failure that asks for more than
        MAX_RETRY_DELAY_SECONDS is not retried. An exception that is no ActionError is a bug, not a
        transient failure: the step fails at once (`_call`). Returns the last Outcome and its attempt."""
        action = self._action(kind)
        last = max(first, MAX_APPLY_ATTEMPTS)
        outcome = Outcome.failure("not attempted")
        attempt = first
        for attempt in range(first, last + 1):
            attempted = {"step": step.as_dict(), "attempt": attempt, "effect_key": step.effect_key}
            await self._ctx.journal.decisions.record_step.in_thread(StepRecord(
                decision_id, idx, kind, StepPhase.INTENT, StepStatus.PENDING, f"attempt {attempt}: {step.summary}",
                attempted))
            with acting(EXECUTOR, policy.target.key, decision_id):
                outcome = await self._call(action.apply(step, policy.target, params), kind, "apply")
            if not outcome.ok:  # refused by the door, maybe: the shard moved; not journaled as failed then
                self._still_leads(policy.target.key, f"step {idx}'s apply failed ({outcome.message})")
            delay = _retry_delay(attempt, outcome)
            if not outcome.ok and outcome.retryable and attempt < last and delay > MAX_RETRY_DELAY_SECONDS:
                outcome = Outcome(outcome.status, f"{outcome.message}; not retried: it asks to wait {delay:g}s, "
                                                  f"more than {MAX_RETRY_DELAY_SECONDS:g}s", False, outcome.data)
            await self._ctx.journal.decisions.record_step.in_thread(StepRecord(
                decision_id, idx, kind, StepPhase.APPLY, StepStatus(outcome.status.value), outcome.message,
                {**attempted, "retryable": outcome.retryable, **dict(outcome.data)}, time.monotonic() - started))
            if outcome.ok or not outcome.retryable or attempt == last:
                break
            await self._ctx.sleep(delay)
        return outcome, attempt

    async def _call(self, coro: Awaitable[Outcome], kind: str, phase: str) -> Outcome:
        """An action's apply, verify or revert as an Outcome; an exception that is no ActionError
        (logged with its traceback by `guarded`) is counted as a fault and fails, not retryable."""
        outcome = await _outcome(coro, kind, phase)
        if UNEXPECTED in outcome.data:
            self._ctx.metrics.faults.labels("actions").inc()
        return outcome

    async def _remember_pin(self, decision_id: int, policy: LoadedPolicy, outcome: Outcome) -> None:
        """Journal the version a verified rollback pinned (`pin` in its data), for new replicas, with
        why (the decision, its signal, the plan's reason) and the version rolled back from (marked bad)."""
        pin = outcome.data.get("pin") if outcome.ok else None
        if pin:
            from_version = pin.get("from_version")
            await self._ctx.journal.pins.record.in_thread(
                policy.target.key, pin["model"], int(pin["version"]),
                from_version=int(from_version) if from_version is not None else None,
                decision_id=decision_id, reason=str(pin.get("reason", "")), policy=policy.name)
            self._ctx.on_recorded()

    async def revert(self, decision_id: int, policy: LoadedPolicy, applied: list[tuple[int, Step]],
                      progress: Mapping[int, StepProgress]) -> list[int]:
        """Undo `applied` in reverse order, except what was reverted before a restart; the indexes
        whose revert failed (their change may remain)."""
        failed = []
        for idx, step in reversed(applied):
            if idx in progress and progress[idx].reverted:
                continue
            bound = policy.actions[idx]
            self._still_leads(policy.target.key, f"stopped before reverting step {idx}")
            with acting(REVERT, policy.target.key, decision_id):
                outcome = await self._call(self._action(bound.kind).revert(step, policy.target, bound.params),
                                           bound.kind, "revert")
            if not outcome.ok:
                self._still_leads(policy.target.key, f"step {idx}'s revert failed ({outcome.message})")
            await self._ctx.journal.decisions.record_step.in_thread(StepRecord(
                decision_id, idx, bound.kind, StepPhase.REVERT, StepStatus(outcome.status.value), outcome.message,
                dict(outcome.data)))
            self._ctx.metrics.actions.labels(bound.kind, "reverted" if outcome.ok else "revert_failed").inc()
            if not outcome.ok:
                failed.append(idx)
        return failed

UNEXPECTED = "exception"  # Outcome data of a call that raised no ActionError: {"type", "message"}


class UnexpectedError(ActionError):
    """An action call raised an exception that is no ActionError: a bug (or an error the action
    did not classify), never retried: only an action knows a failure is transient and says so
    (TemporaryError, or a retryable Outcome)."""

    def __init__(self, kind: str, phase: str, exc: Exception) -> None:
        super().__init__(f"{kind}.{phase} raised {type(exc).__name__}: {exc}", retryable=False)
        self.error_type = type(exc).__name__
        self.error = str(exc)


async def guarded(coro: Awaitable[T], kind: str, phase: str) -> T:
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
        return await guarded(coro, kind, phase)
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
