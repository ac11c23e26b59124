"""Shadow triggers: which trigger of a policy produced a signal, whether it only watches, and what
its decision journals. Pure.

A shadow trigger's signals are decided like any other (`daemon.workers.decide`: guards read, not
committed; silences asked, targets observed, the plan built) and journaled as what would have been
done (`shadow_row`); nothing is applied and the decision is not `executed`, so it never counts
toward the cooldown or rate limit of the policy's live triggers.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from core.decision import DecisionState
from core.signal import Signal, SignalSource
from daemon.workers.verdicts import Blocked, DryRun, NeedsApproval, NoOp, Unplanned, Verdict
from policies.loader import LoadedPolicy
from policies.matching import alert_trigger_matches
from policies.planning import Plan

SHADOW_PREFIX = "shadow"
"""Every shadow decision's reason starts with this word (status, `tailguard journal`)."""


@dataclass(frozen=True)
class ShadowOrigin:
    """The shadow trigger a signal came from."""

    index: int  # position in the policy's triggers list
    kind: str  # "detector tail_anomaly", "alert TritonTailLatencyHigh", "schedule"

    @property
    def label(self) -> str:
        return f"{SHADOW_PREFIX} trigger {self.index} ({self.kind})"

    def as_dict(self) -> dict[str, object]:
        return {"trigger": self.index, "kind": self.kind}


def trigger_index(signal: Signal) -> int | None:
    """The trigger index a detector or schedule signal names in its dedup key
    (`detector:<policy>:<index>:...`, `schedule:<policy>:<index>:<slot>`; policy names hold no colon)."""
    if signal.source is SignalSource.ALERT:
        return None
    parts = signal.dedup_key.split(":")
    if len(parts) < 3 or parts[0] != signal.source.value or not parts[2].isdigit():
        return None
    return int(parts[2])


def shadow_origin(policy: LoadedPolicy, signal: Signal) -> ShadowOrigin | None:
    """The shadow trigger of `policy` that `signal` came from, or None when a live trigger did.

    Fails safe: a signal the poller marked shadow stays shadow even if a reload since moved the
    triggers; an alert counts as shadow only when every alert trigger of the policy it matches is.
    """
    triggers = policy.spec.triggers
    if signal.source is SignalSource.ALERT:
        matched = [(i, t) for i, t in enumerate(triggers)
                   if t.alert is not None and alert_trigger_matches(t.alert, policy, signal)]
        if matched and all(t.shadow for _, t in matched):
            return ShadowOrigin(matched[0][0], f"alert {signal.name}")
        return None
    idx = trigger_index(signal)
    marked = bool(signal.details.get("shadow"))
    trigger = triggers[idx] if idx is not None and idx < len(triggers) else None
    if marked or (trigger is not None and trigger.shadow):
        kind = "schedule" if signal.source is SignalSource.SCHEDULE else f"detector {signal.name}"
        return ShadowOrigin(idx if idx is not None else -1, kind)
    return None


@dataclass(frozen=True)
class ShadowRow:
    """What a shadow decision journals: what the trigger would do, as its decision's state and reason."""

    would: str  # act | blocked | silenced | noop | fail (tailguard_shadow_decisions_total, the plan's `shadow`)
    state: DecisionState
    reason: str  # starts with the trigger's label (SHADOW_PREFIX)
    plan: Plan
    note: Mapping[str, Any]  # journaled in the plan besides `shadow` (only a silence's)


def shadow_row(verdict: Verdict, origin: ShadowOrigin) -> ShadowRow:
    """The journal row of a shadow trigger's verdict: never executed; whatever the live trigger would
    apply (dryRun and approval included) reads would "act", in state dry_run."""
    label = origin.label
    plan = verdict.plan
    if isinstance(verdict, Blocked):
        if verdict.silenced:
            return ShadowRow("silenced", DecisionState.BLOCKED, f"{label}: would be {verdict.reason}", plan,
                             verdict.note)
        reason = verdict.reason
        if verdict.awaiting is not None:  # a shadow row names only the approval it waits behind
            reason = f"awaiting approval {verdict.awaiting}"
            plan = replace(plan, blocked=reason)
        return ShadowRow("blocked", DecisionState.BLOCKED, f"{label}: would be blocked: {reason}", plan, {})
    if isinstance(verdict, Unplanned):
        return ShadowRow("fail", DecisionState.DRY_RUN, f"{label}: would fail: planning failed: {verdict.error}",
                         plan, {})
    if isinstance(verdict, NoOp):
        return ShadowRow("noop", DecisionState.NOOP, f"{label}: {plan.blocked}", plan, {})
    how = ("would only plan (dryRun)" if isinstance(verdict, DryRun) else
           "would ask for approval, then apply" if isinstance(verdict, NeedsApproval) else "would apply")
    summary = "; ".join(s.summary for s in plan.steps if not s.noop)
    return ShadowRow("act", DecisionState.DRY_RUN, f"{label}: {how}: {summary}; not applied", plan, {})
