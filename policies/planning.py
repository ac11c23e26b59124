"""Plan: the concrete steps one policy decided for one signal. Built without I/O."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actions.base import Step
from core.signal import Signal
from policies.guards import GuardDecision
from policies.loader import LoadedPolicy


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


def build_plan(policy: LoadedPolicy, signal: Signal, steps: list[Step]) -> Plan:
    """The plan from the steps each action planned; all-noop plans are recorded as such."""
    blocked = None
    if steps and all(s.noop for s in steps):
        blocked = "nothing to do: every step is a no-op"
    return Plan(policy.name, policy.target.key, signal.dedup_key, tuple(steps),
                policy.spec.guards.dry_run, blocked)
