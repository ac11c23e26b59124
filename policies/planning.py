"""Plan: the concrete steps one policy decided for one signal, and how its recovery is judged. Built
without I/O."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from actions.base import Step
from core.detection import RecoveryLine, Side
from core.promql import render_query
from core.query import Sample
from core.signal import Signal, SignalSource, UnsidedLine
from policies.guards import GuardDecision
from policies.loader import BoundDetector, LoadedPolicy
from policies.recovery import RecoveryCondition
from policies.schema import VerifySpec


@dataclass(frozen=True)
class Plan:
    policy: str
    target: str
    signal_key: str
    steps: tuple[Step, ...]
    dry_run: bool
    blocked: str | None = None  # why nothing will be done, when something stops it

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "target": self.target,
            "signal": self.signal_key,
            "dry_run": self.dry_run,
            "blocked": self.blocked,
            "steps": [s.as_dict() for s in self.steps],
        }


def blocked_plan(policy: LoadedPolicy, signal: Signal, decision: GuardDecision) -> Plan:
    """The plan when a guard says no: no steps, the reason recorded."""
    return Plan(policy.name, policy.target.key, signal.dedup_key, (), policy.spec.guards.dry_run,
                blocked=decision.reason)


def unplanned(policy: LoadedPolicy, signal: Signal, error: Exception) -> Plan:
    """The plan when an action could not plan (observe or plan raised): no steps, why recorded."""
    return Plan(policy.name, policy.target.key, signal.dedup_key, (), policy.spec.guards.dry_run,
                blocked=f"planning failed: {error}")


def build_plan(policy: LoadedPolicy, signal: Signal, steps: list[Step]) -> Plan:
    """The plan from the steps each action planned; all-noop plans are recorded as such."""
    blocked = None
    if steps and all(s.noop for s in steps):
        blocked = "nothing to do: every step is a no-op"
    return Plan(policy.name, policy.target.key, signal.dedup_key, tuple(steps),
                policy.spec.guards.dry_run, blocked)


@dataclass(frozen=True)
class RecoveryCheck:
    """How a decision's recovery is judged once its plan succeeded: the rendered query, the line
    and windows, and what follows when it does not recover. Journaled with the decision (`as_dict`)
    so that a restart resumes the same check."""

    query: str
    condition: RecoveryCondition
    interval: float
    on_not_recovered: str  # escalate | revert | none
    source: str  # where the line comes from: the verify block, or the detector's episode start
    model: str = ""
    model_label: str | None = None  # set: only series of `model` count (a detector's own query)

    def value(self, samples: Iterable[Sample]) -> float | None:
        """One value for an instant answer: the worst of the series that count (all must be on
        the good side), None when none counts."""
        values = [s.value for s in samples
                  if self.model_label is None or s.labels.get(self.model_label, self.model) == self.model]
        if not values:
            return None
        return max(values) if self.condition.below is not None else min(values)

    def as_dict(self) -> dict[str, Any]:
        c = self.condition
        return {"query": self.query, "below": c.below, "above": c.above, "hold_seconds": c.hold_seconds,
                "within_seconds": c.within_seconds, "max_gap_seconds": c.max_gap_seconds,
                "interval_seconds": self.interval, "on_not_recovered": self.on_not_recovered,
                "source": self.source, "model": self.model, "model_label": self.model_label}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RecoveryCheck":
        condition = RecoveryCondition(data["below"], data["above"], float(data["hold_seconds"]),
                                      float(data["within_seconds"]), float(data["max_gap_seconds"]))
        return cls(data["query"], condition, float(data["interval_seconds"]), data["on_not_recovered"],
                   data["source"], data.get("model", ""), data.get("model_label"))


def _max_gap(interval: float) -> float:
    """Samples further apart than this break a good stretch: one missed poll is tolerated, two are not."""
    return 2.5 * interval


def recovery_check(policy: LoadedPolicy, signal: Signal) -> RecoveryCheck | None:
    """The recovery check for `policy` acting on `signal`, or None when there is none: the verify
    block when the policy has one; else, for a detector signal, the detector's own query held on
    the good side of the line its detection drew at the episode's start (`Signal.recovery_line`),
    never a line computed later from data the incident has contaminated."""
    target = policy.target
    values = {"model": target.model, "namespace": target.namespace}
    verify = policy.spec.verify
    if verify is not None:
        condition = RecoveryCondition(verify.below, verify.above, verify.hold, verify.within,
                                      _max_gap(verify.interval))
        return RecoveryCheck(render_query(verify.query, values), condition, verify.interval,
                             verify.on_not_recovered, "verify", target.model)
    bound = _signal_detector(policy, signal)
    # A query that is not PromQL (read from Triton) draws no line a Prometheus verify could hold;
    # nor does one that is not a level (counters: the detection draws none).
    if bound is None or bound.trigger.source != "prometheus":
        return None
    line = _sided(signal.recovery_line, bound)
    if line is None:
        return None
    defaults = VerifySpec.model_fields
    hold, within = float(defaults["hold"].default), float(defaults["within"].default)
    interval = min(bound.trigger.interval, within)
    below = line.level if line.good is Side.BELOW else None
    above = line.level if line.good is Side.ABOVE else None
    condition = RecoveryCondition(below, above, hold, within, _max_gap(interval))
    return RecoveryCheck(render_query(bound.trigger.query, values), condition, interval,
                         defaults["on_not_recovered"].default,
                         f"detector {bound.trigger.type} {line.drawn_from} at episode start",
                         target.model, bound.trigger.model_label)


def _sided(line: RecoveryLine | UnsidedLine | None, bound: BoundDetector) -> RecoveryLine | None:
    """The signal's line with its side; a line journaled before lines carried one (a signal pending
    across an upgrade) takes the side its detector's parameters say, as the check did then."""
    if not isinstance(line, UnsidedLine):
        return line
    rule = bound.params.recovery_rule
    return line.sided(rule.good) if rule is not None else None


def _signal_detector(policy: LoadedPolicy, signal: Signal) -> BoundDetector | None:
    """The detector trigger of `policy` that produced `signal` (None for other signals): the one its
    trigger reference names, when that is still a trigger of the detector's type; else (a reload moved
    the triggers since) the one of its type with its query, else the first of its type."""
    if signal.source is not SignalSource.DETECTOR or signal.policy != policy.name:
        return None
    ref = signal.trigger_ref()
    named = next((b for b in policy.detectors if b.index == ref.index and b.trigger.type == signal.name), None)
    if named is not None and signal.details.get("query", named.trigger.query) == named.trigger.query:
        return named
    kinds = [b for b in policy.detectors if b.trigger.type == signal.name]
    same = [b for b in kinds if b.trigger.query == signal.details.get("query")]
    found = same or kinds
    return found[0] if found else None


def recovery_warning(policy: LoadedPolicy) -> str | None:
    """Why some signals of `policy` get no recovery check after acting (for `tailguard validate`)."""
    if policy.spec.verify is not None:
        return None
    if any(b.trigger.source != "prometheus" or b.params.recovery_rule is None for b in policy.detectors):
        return ("its tail_excess / source: triton signals get no recovery check after acting (no verify "
                "block, and their query draws no line to hold)")
    if not any(t.alert for t in policy.spec.triggers):
        return None
    if policy.detectors:
        return ("alert signals get no recovery check after acting (no verify block; only detector signals "
                "default to the detector's line)")
    spec = policy.spec
    if not spec.guards.dry_run and any(not t.shadow for t in spec.triggers):  # alerts and schedules
        return "alert signals get no recovery check after acting (no verify block)"
    # Nothing is ever applied; the loader requires a verify block once it may act on alerts only.
    return ("alert-only policy without a verify block: loaded only because it never acts (dryRun, or every "
            "trigger shadow); the loader refuses it once it may act")
