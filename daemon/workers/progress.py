"""How far each step of a decision got, read back from its journaled step rows, whether its
journaled plan may still run, and the policy it runs on: what a decision resumed after a restart
(or approved) goes on from (pure: rows in, progress out).

A decision journals the policy it started with (`STARTED_WITH` in its plan: the policy document and
its recovery check). Resumed after a restart or reverted after a reload, it runs on that policy, its
parameters, onFailure and recovery check, never on the reloaded one's; a policy renamed or removed
since does not strand it. Only a policy of the same name that now runs other actions stops it (the
operator changed the remedy: the journaled plan is not one it would make). A decision journaled by
an older version (no policy with it) runs on the current policy when that runs its actions, as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, TypeGuard

from actions.base import Action, Step
from core.outcome import Outcome, OutcomeStatus
from daemon.storage.records import StepRow
from daemon.storage.step_kinds import StepPhase, StepStatus
from policies.loader import LoadedPolicy, PolicyLoadError, policy_document, restore_policy
from policies.planning import Plan, RecoveryCheck

# The executor owns retries of transient failures (an Outcome marked retryable): up to this many
# applies per step. Actions retry nothing themselves except write conflicts, inside their
# compare-and-swap, and an exhausted conflict comes back not retryable.
MAX_APPLY_ATTEMPTS = 3
_LANDED = (StepStatus.OK, StepStatus.NOOP)  # an apply (or revert) row whose change is in place
INTENT = StepPhase.INTENT  # the step row phase journaled before each apply call


@dataclass
class StepProgress:
    """How far one step got, as its journaled rows say (what a resumed decision goes on from)."""

    attempt: int = 0  # the last attempt with an intent or a result
    in_doubt: bool = False  # that attempt's intent has no result: its call may or may not have landed
    result: StepRow | None = None  # the apply row of that attempt
    verify: StepRow | None = None  # the verify row after it
    reverted: bool = False  # a revert of it was recorded as done

    @property
    def landed(self) -> bool:
        return self.result is not None and self.result.status in _LANDED

    def final(self) -> Outcome | None:
        """The step's final Outcome when the journal already has it (nothing to call), else None."""
        if self.result is None or self.in_doubt:
            return None
        if self.landed:
            return journaled_outcome(self.verify) if self.verify is not None else None
        if self.result.data.get("retryable") and self.attempt < MAX_APPLY_ATTEMPTS:
            return None  # a retryable failure with attempts left: the retries go on
        return journaled_outcome(self.result)


def step_progress(rows: Iterable[StepRow]) -> dict[int, StepProgress]:
    """Each step's progress (by index) from a decision's step rows, oldest first."""
    progress: dict[int, StepProgress] = {}
    for row in rows:
        if row.phase == StepPhase.RECOVERY:
            continue  # about the decision as a whole, not one step
        step = progress.setdefault(int(row.idx), StepProgress())
        if row.phase == StepPhase.INTENT:
            step.attempt, step.in_doubt, step.result, step.verify = int(row.data["attempt"]), True, None, None
        elif row.phase == StepPhase.APPLY:
            step.attempt, step.in_doubt, step.result = int(row.data.get("attempt", step.attempt)), False, row
        elif row.phase == StepPhase.VERIFY:
            step.verify = row
        elif row.phase == StepPhase.REVERT:
            step.reverted = row.status in _LANDED
    return progress


def journaled_outcome(row: StepRow) -> Outcome:
    return Outcome(OutcomeStatus(row.status.value), row.message, data=row.data)


def journaled_plan(plan: Mapping[str, Any]) -> Plan:
    """The Plan a decision journaled (`Plan.as_dict`)."""
    return Plan(plan["policy"], plan["target"], plan["signal"], tuple(Step.from_dict(s) for s in plan["steps"]),
                bool(plan["dry_run"]), plan.get("blocked"))


def policy_runs_plan(policy: LoadedPolicy | None, plan: Plan) -> TypeGuard[LoadedPolicy]:
    """Whether `policy` (None: gone since) still runs the actions `plan` journaled, in that order: a
    journaled plan is applied only then (resumed after a restart, approved, resumed once approved);
    a policy that changed its actions since would have planned differently."""
    return policy is not None and [s.action for s in plan.steps] == [b.kind for b in policy.actions]


STARTED_WITH = "started_with"
"""The journaled plan's key for the policy the decision started with: {"policy": its document,
"source": where it was loaded from, "recovery": its recovery check or None, "recovery_skipped": why
none is made (or None)}."""


@dataclass(frozen=True)
class RecoveryPlan:
    """How a decision's recovery will be judged once its plan succeeds: the check, or why none."""

    check: RecoveryCheck | None
    skipped: str | None = None  # why no check is made (journaled as a skipped recovery row)


def started_with_document(policy: LoadedPolicy, recovery: RecoveryPlan) -> dict[str, Any]:
    """What a decision journals of the policy it starts with (`STARTED_WITH`)."""
    return {"policy": policy_document(policy), "source": policy.source,
            "recovery": recovery.check.as_dict() if recovery.check is not None else None,
            "recovery_skipped": recovery.skipped}


@dataclass(frozen=True)
class RunsOn:
    """The policy a journaled decision goes on with (None: it must not go on), and why."""

    policy: LoadedPolicy | None
    why: str
    recovery: RecoveryPlan | None = None  # journaled with the decision; None: made from `policy` now
    reloaded: bool = False  # the active policy of that name differs from the one it runs on (or is gone)


def runs_on(plan_document: Mapping[str, Any], current: LoadedPolicy | None,
            actions: Mapping[str, type[Action]]) -> RunsOn:
    """The policy a journaled decision resumes or reverts on: the one it started with (restored from
    the journal), unless `current` (the active policy of its name, None: gone) now runs other
    actions; for a decision journaled without its policy, `current` when it runs the plan's actions."""
    plan = journaled_plan(plan_document)
    planned = [s.action for s in plan.steps]
    if current is not None and not policy_runs_plan(current, plan):
        return RunsOn(None, f"policy {current.name} now runs {[b.kind for b in current.actions]}, the journaled "
                            f"plan {planned}")
    saved = plan_document.get(STARTED_WITH)
    if not isinstance(saved, Mapping):
        if policy_runs_plan(current, plan):
            return RunsOn(current, "the active policy (the decision journaled none)")
        return RunsOn(None, f"policy {plan.policy} is gone and the decision journaled none to go on with")
    try:
        restored = restore_policy(saved["policy"], str(saved.get("source", "journal")), actions)
    except (PolicyLoadError, KeyError, TypeError) as exc:
        return RunsOn(None, f"the policy journaled with it no longer loads: {exc}")
    if not policy_runs_plan(restored, plan):
        return RunsOn(None, f"the policy journaled with it runs other actions than its plan {planned}")
    check = saved.get("recovery")
    recovery = RecoveryPlan(RecoveryCheck.from_dict(check) if isinstance(check, Mapping) else None,
                            saved.get("recovery_skipped"))
    reloaded = current is None or policy_document(current) != saved["policy"]
    why = "the policy it started with" + (
        "" if not reloaded else f" (policy {plan.policy} is gone since)" if current is None
        else f" (policy {plan.policy} was reloaded since)")
    return RunsOn(restored, why, recovery, reloaded)
