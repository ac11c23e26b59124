"""How far each step of a decision got, read back from its journaled step rows: what a decision
resumed after a restart goes on from (pure: rows in, progress out)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from actions.base import Step
from core.outcome import Outcome, OutcomeStatus
from daemon.storage.journal import RECOVERY
from policies.planning import Plan

# The executor owns retries of transient failures (an Outcome marked retryable): up to this many
# applies per step. Actions retry nothing themselves except write conflicts, inside their
# compare-and-swap, and an exhausted conflict comes back not retryable.
MAX_APPLY_ATTEMPTS = 3
INTENT = "intent"  # the step row phase journaled before each apply call


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
            return journaled_outcome(self.verify) if self.verify is not None else None
        if self.result["data"].get("retryable") and self.attempt < MAX_APPLY_ATTEMPTS:
            return None  # a retryable failure with attempts left: the retries go on
        return journaled_outcome(self.result)


def step_progress(rows: Iterable[Mapping[str, Any]]) -> dict[int, StepProgress]:
    """Each step's progress (by index) from a decision's step rows, oldest first."""
    progress: dict[int, StepProgress] = {}
    for row in rows:
        if row["phase"] == RECOVERY:
            continue  # about the decision as a whole, not one step
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


def journaled_outcome(row: Mapping[str, Any]) -> Outcome:
    return Outcome(OutcomeStatus(row["status"]), row["message"], data=row["data"])


def journaled_plan(plan: Mapping[str, Any]) -> Plan:
    """The Plan a decision journaled (`Plan.as_dict`)."""
    return Plan(plan["policy"], plan["target"], plan["signal"], tuple(Step.from_dict(s) for s in plan["steps"]),
                bool(plan["dry_run"]), plan.get("blocked"))
