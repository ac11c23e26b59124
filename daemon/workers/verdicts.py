"""What the decision ladder (`daemon.workers.decide`) concludes for one policy and one signal: a typed
verdict, and the mode it was reached in. Pure data.

Every verdict carries the plan as it is journaled (for Blocked and Unplanned: no steps, `blocked`
saying why) and the note that goes into the journaled plan with it (what the silences check found).
Live, shadow and preview runs reach verdicts the same way; they differ only in what they record:
the executor journals and announces a live verdict, journals a shadow one as what would have been
done (`daemon.workers.shadow.shadow_row`), and `tailguard simulate` only shows it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from core.outcome import ActionError
from policies.planning import Plan

Note = Mapping[str, Any]
"""Keys added to the journaled plan (`{"silences": {...}}` once Alertmanager was asked, `{"governance":
{...}}` once an alert was ruled on), else empty."""


class Mode(enum.Enum):
    """Why a decision is made: to act on it, to journal what a shadow trigger would do, or to show it."""

    LIVE = "live"  # a live trigger's signal: journaled, acted on, announced
    SHADOW = "shadow"  # a shadow trigger's signal: journaled as what would be done, never applied
    PREVIEW = "preview"  # `tailguard simulate`: nothing journaled, nothing applied

    @property
    def commits(self) -> bool:
        """Whether the guards may remember this decision (the common-cause escalate-once memory):
        only a live decision escalates, so only it may use up the one escalation of a burst."""
        return self is Mode.LIVE


@dataclass(frozen=True)
class Blocked:
    """A guard, a freeze, the blast radius, an approval already pending, a silence or the governed
    alert rule (`policies.governance`: the alert notifies, it does not start the rollback) says no."""

    plan: Plan  # no steps; `blocked` is `reason`
    reason: str
    escalates: bool = False  # the first suppression of a common-cause burst: announced when live
    silenced: bool = False  # an Alertmanager silence said no (not a guard)
    awaiting: int | None = None  # the id of the approval already pending for this policy and target
    note: Note = field(default_factory=dict)
    notify_only: bool = False  # a governed alert that notifies: journaled, and recorded as an Event when live


@dataclass(frozen=True)
class Unplanned:
    """An action could not observe its target or plan its step (an ActionError, or a planning bug)."""

    plan: Plan  # no steps; `blocked` is "planning failed: <error>"
    error: ActionError
    note: Note = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return self.plan.blocked or ""


@dataclass(frozen=True)
class NoOp:
    """Every planned step is a no-op: nothing to do (`plan.blocked` says so)."""

    plan: Plan
    note: Note = field(default_factory=dict)


@dataclass(frozen=True)
class DryRun:
    """The policy is `dryRun`: the plan is journaled, never applied."""

    plan: Plan
    note: Note = field(default_factory=dict)


@dataclass(frozen=True)
class NeedsApproval:
    """The policy says `approval: required`: the plan waits for an operator."""

    plan: Plan
    note: Note = field(default_factory=dict)


@dataclass(frozen=True)
class Execute:
    """Apply the plan now."""

    plan: Plan
    note: Note = field(default_factory=dict)


Verdict = Union[Blocked, Unplanned, NoOp, DryRun, NeedsApproval, Execute]
"""What one policy decided for one signal."""
