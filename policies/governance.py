"""The governed alert: how an alert trigger may start a rollback-class action without spending a
false-alarm budget nobody states. Pure: the live ladder (`daemon.workers.evidence`), `tailguard
backtest` and `tailguard simulate` all rule with `rule` (docs/detectors.md, "The alert backstop").

A policy states one promise (its detector's false rollbacks per version-day at half budget). An
alert rule states none, so on a policy with a rollback-class action an alert trigger starts the
rollback only as a liveness backstop: when no detector trigger of the policy has judged fresh data of
the target for longer than its `backstopAfter`. While the detector sees the target its test keeps
the promise and the alert notifies (journaled notify-only, with why). No evidence is never proof of
a regression: a restart's first `backstopAfter` (a detector that has not run yet) is not missing
evidence, and the backstop acts only on an alert that fired while the detector was blind.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from actions.istio import KIND as SHIFT_WEIGHTS
from actions.triton import KIND as ROLLBACK
from core.signal import Signal, SignalSource, TriggerRef
from policies.gate import GateVerdict
from policies.loader import BoundDetector, LoadedPolicy
from policies.matching import alert_trigger_matches

ROLLBACK_CLASS = frozenset({ROLLBACK, SHIFT_WEIGHTS})
"""Action kinds that take a version (or its traffic) away: what a false alarm costs a rollback."""


class Standing(enum.Enum):
    """How an alert trigger stands toward its policy's promise (fixed when the policy loads)."""

    FREE = "free"  # the policy has no rollback-class action: the alert acts as any trigger does
    GOVERNED = "governed"  # a detector trigger governs it: it acts only as the liveness backstop
    NOTIFY_ONLY = "notify_only"  # nothing can govern it: it only notifies (the policy loads with a warning)
    UNGOVERNED = "ungoverned"  # `actsUngoverned: true`: it acts outside the promise (with a warning)


@dataclass(frozen=True)
class AlertGovernance:
    """One alert trigger of a policy: its standing, the detector triggers whose evidence governs it,
    and how long that evidence may be missing before the alert acts as the backstop."""

    index: int  # the alert trigger's position in the policy's triggers
    standing: Standing
    detectors: tuple[int, ...]  # indices of the governing detector triggers
    backstop_after: float

    @property
    def warning(self) -> str | None:
        """Why the trigger cannot keep the policy's promise (None: it can)."""
        if self.standing is Standing.NOTIFY_ONLY:
            return (f"alert trigger {self.index} cannot keep the policy's promise: no live detector trigger of "
                    "the policy governs it, so it only notifies (add a detector trigger, or set "
                    "`actsUngoverned: true` to let it roll back outside the policy's false-alarm rate)")
        if self.standing is Standing.UNGOVERNED:
            return (f"alert trigger {self.index} acts ungoverned (actsUngoverned: true): its rollbacks are "
                    "outside the policy's false-alarm rate, which nothing states")
        return None


def rollback_kinds(policy: LoadedPolicy) -> tuple[str, ...]:
    """The policy's rollback-class action kinds, in order."""
    return tuple(a.kind for a in policy.actions if a.kind in ROLLBACK_CLASS)


def governing_detectors(policy: LoadedPolicy, alert_index: int) -> tuple[BoundDetector, ...]:
    """The detector triggers whose evidence governs the alert trigger at `alert_index`: the one it
    names (`governedBy`, else its gate's `detector`), else every live (not shadow) detector trigger."""
    alert = policy.spec.triggers[alert_index].alert
    named = alert.governed_by if alert is not None else None
    if named is None and alert is not None and alert.gate is not None:
        named = alert.gate.detector
    if named is not None:
        return tuple(d for d in policy.detectors if d.index == named)
    return tuple(d for d in policy.detectors if not policy.spec.triggers[d.index].shadow)


def alert_governance(policy: LoadedPolicy, alert_index: int) -> AlertGovernance:
    """How the alert trigger at `alert_index` of `policy` stands (raises ValueError when that trigger
    is not an alert trigger)."""
    alert = policy.spec.triggers[alert_index].alert
    if alert is None:
        raise ValueError(f"trigger {alert_index} of {policy.name} is not an alert trigger")
    detectors = tuple(d.index for d in governing_detectors(policy, alert_index))
    if not rollback_kinds(policy):
        standing = Standing.FREE
    elif alert.acts_ungoverned:
        standing = Standing.UNGOVERNED
    elif detectors:
        standing = Standing.GOVERNED
    else:
        standing = Standing.NOTIFY_ONLY
    return AlertGovernance(alert_index, standing, detectors, float(alert.backstop_after))


def policy_warnings(policy: LoadedPolicy) -> list[str]:
    """Why the policy's triggers cannot keep its promise, one line each (`tailguard validate`, status,
    the log and a Kubernetes Event when it loads); empty when every trigger keeps it."""
    out = []
    for index, trigger in enumerate(policy.spec.triggers):
        if trigger.alert is not None and not trigger.shadow:
            warning = alert_governance(policy, index).warning
            if warning is not None:
                out.append(warning)
    return out


@dataclass(frozen=True)
class Ruling:
    """Whether an alert signal may start the policy's actions now, and why (journaled in the
    decision's note). `backstop`: it acts because the governing detector is blind."""

    acts: bool
    reason: str
    standing: Standing
    backstop: bool = False
    trigger: int | None = None  # the alert trigger ruled on (its index in the policy's triggers)

    @property
    def outcome(self) -> str:
        """One word for the metric and the note: backstop, notify, ungoverned, vetoed or free."""
        if self.backstop:
            return "backstop"
        if self.standing is Standing.UNGOVERNED:
            return "ungoverned" if self.acts else "vetoed"
        if self.standing is Standing.FREE:
            return "free"
        return "notify"

    def as_note(self) -> dict[str, Any]:
        return {"acts": self.acts, "outcome": self.outcome, "standing": self.standing.value, "trigger": self.trigger,
                "reason": self.reason}


def matched_alert(policy: LoadedPolicy, signal: Signal) -> TriggerRef | None:
    """The alert trigger of `policy` an alert signal spoke through: its reference resolved to the first
    alert trigger it matches (None: not an alert, or it matches none)."""
    if signal.source is not SignalSource.ALERT:
        return None
    for index, trigger in enumerate(policy.spec.triggers):
        if trigger.alert is not None and alert_trigger_matches(trigger.alert, policy, signal):
            return signal.trigger_ref().at(index)
    return None


def rule(governance: AlertGovernance, fresh_at: float | None, started_at: float, now: float,
         gate: GateVerdict | None = None) -> Ruling:
    """The ruling on an alert signal of the trigger `governance` describes.

    Args:
        governance: The alert trigger's standing (`alert_governance`).
        fresh_at: The last time any governing detector trigger judged fresh data of the target
            (None: none has since the daemon started).
        started_at: When the daemon (or the replay) started: evidence cannot be missing before it.
        now: Unix time of the decision.

    Returns:
        Acts as the backstop once the evidence has been missing for longer than `backstop_after`,
        counted from the last fresh judgement or the start, whichever is later; notifies otherwise.
        A FREE trigger acts; an UNGOVERNED one acts unless its `gate` (the former rule, weighed by
        the caller: `gate_verdict`) vetoes; a NOTIFY_ONLY one notifies.
    """
    return replace(_ruling(governance, fresh_at, started_at, now, gate), trigger=governance.index)


def _ruling(governance: AlertGovernance, fresh_at: float | None, started_at: float, now: float,
            gate: GateVerdict | None) -> Ruling:
    standing = governance.standing
    if standing is Standing.FREE:
        return Ruling(True, "no rollback-class action: the alert acts as any trigger", standing)
    if standing is Standing.UNGOVERNED:
        if gate is not None and gate.veto:
            return Ruling(False, gate.reason, standing)
        return Ruling(True, "actsUngoverned: true: the alert acts outside the policy's false-alarm rate", standing)
    if standing is Standing.NOTIFY_ONLY:
        return Ruling(False, "notify only: no detector trigger of the policy governs this alert, so it cannot "
                      "start a rollback within the policy's promise (actsUngoverned: true opts out)", standing)
    limit = governance.backstop_after
    which = ", ".join(str(i) for i in governance.detectors)
    if fresh_at is not None and fresh_at >= started_at:
        age = max(0.0, now - fresh_at)
        if age <= limit:
            return Ruling(False, f"notify only: the governing detector (trigger {which}) judged fresh data of the "
                          f"target {age:.0f} s ago and keeps the policy's promise; the alert states no rate of its "
                          f"own, so it starts no rollback while the detector sees (backstopAfter {limit:g} s)",
                          standing)
        return Ruling(True, f"backstop: no fresh evidence from the governing detector (trigger {which}) for "
                      f"{age:.0f} s, longer than backstopAfter {limit:g} s: the alert acts as the liveness backstop",
                      standing, backstop=True)
    up = max(0.0, now - started_at)
    if up <= limit:
        return Ruling(False, f"notify only: started {up:.0f} s ago and the governing detector (trigger {which}) has "
                      f"not judged fresh data of the target since; a start's first {limit:g} s (backstopAfter) are "
                      "not missing evidence", standing)
    return Ruling(True, f"backstop: the governing detector (trigger {which}) has judged no fresh data of the target "
                  f"in the {up:.0f} s since the start, longer than backstopAfter {limit:g} s: the alert acts as "
                  "the liveness backstop", standing, backstop=True)
