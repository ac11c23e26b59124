"""The Kubernetes Event reason of each decision state and recovery verdict: every decision and
every verdict becomes an Event on the target's object (its Service; the recorder falls back to the
daemon's own pod), beside the per-step Events (Remediated, RemediationFailed) and PinEnded.
Pure: what is recorded, not how."""
from __future__ import annotations

from core.decision import DecisionState

DECISION_EVENTS: dict[DecisionState, tuple[str, bool]] = {
    DecisionState.BLOCKED: ("RemediationBlocked", True),
    DecisionState.DRY_RUN: ("RemediationDryRun", False),
    DecisionState.NOOP: ("RemediationNoop", False),
    DecisionState.SUCCEEDED: ("RemediationSucceeded", False),
    DecisionState.FAILED: ("RemediationFailed", True),
    DecisionState.REVERTED: ("RemediationReverted", True),
    DecisionState.EXPIRED: ("RemediationExpired", True),
}
"""Decision state -> (Event reason, whether a Warning). `executing` is not an end: no Event."""

VERDICT_EVENTS: dict[str, tuple[str, bool]] = {
    "recovered": ("Recovered", False),
    "not_recovered": ("NotRecovered", True),
    "unknown": ("RecoveryUnknown", True),
}
"""Recovery verdict -> (Event reason, whether a Warning)."""


def decision_event(state: DecisionState) -> tuple[str, bool] | None:
    """The Event of a decision that ended in `state` (None: not an end)."""
    return DECISION_EVENTS.get(state)


def verdict_event(verdict: str) -> tuple[str, bool]:
    """The Event of a recovery verdict (an unknown word reads as `unknown`)."""
    return VERDICT_EVENTS.get(verdict, VERDICT_EVENTS["unknown"])
