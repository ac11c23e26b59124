"""The states a decision moves through, as stored in the journal's `decisions.state` column."""
from __future__ import annotations

from enum import StrEnum


class DecisionState(StrEnum):
    """A StrEnum: the journal stores the value, and a state compares equal to its text."""

    BLOCKED = "blocked"  # a guard said no (cooldown, rate limit, freeze)
    DRY_RUN = "dry_run"  # planned, not applied (guards.dryRun)
    NOOP = "noop"  # every step was already as wanted
    EXECUTING = "executing"  # journaled before the first write; left so only by a crash
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REVERTED = "reverted"  # a step failed and the earlier ones were undone (onFailure: revert)
    # Not resumed: its signal grew older than executor.maxSignalAgeSeconds, or the target is no longer
    # as its plan found it. Journaled as `failed` with the plan's EXPIRED_KEY set, so a version that
    # knows no `expired` reads a failed decision (the journal's readers map it back).
    EXPIRED = "expired"

    @property
    def final(self) -> bool:
        """Whether the decision is over (anything but `executing`)."""
        return self is not DecisionState.EXECUTING


EXPIRED_KEY = "expired"
"""The journaled plan's key that makes a stored `failed` decision an expired one: {"why", "age_seconds"}."""


def stored_state(state: DecisionState) -> DecisionState:
    """The state as the journal stores it: `expired` as `failed` (older versions know no `expired`)."""
    return DecisionState.FAILED if state is DecisionState.EXPIRED else state


def read_state(stored: str, plan: object) -> DecisionState:
    """The state of a stored decision: `failed` with EXPIRED_KEY in its plan is `expired`."""
    state = DecisionState(stored)
    if state is DecisionState.FAILED and isinstance(plan, dict) and plan.get(EXPIRED_KEY):
        return DecisionState.EXPIRED
    return state
