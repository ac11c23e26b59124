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

    @property
    def final(self) -> bool:
        """Whether the decision is over (anything but `executing`)."""
        return self is not DecisionState.EXECUTING
