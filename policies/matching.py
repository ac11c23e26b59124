"""Which policies a signal concerns. Pure: no I/O, targets come from policies, never from labels."""
from __future__ import annotations

from typing import Iterable, Mapping, Protocol

from core.signal import SignalSource, SignalStatus
from policies.loader import LoadedPolicy
from policies.schema import AlertTrigger


class Matchable(Protocol):
    """What matching reads of a signal: a Signal, or the SignalHead of a journaled one."""

    @property
    def source(self) -> SignalSource: ...
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> SignalStatus: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def policy(self) -> str | None: ...


def alert_trigger_matches(trigger: AlertTrigger, policy: LoadedPolicy, signal: Matchable) -> bool:
    """True when an alert signal satisfies one alert trigger of `policy`."""
    if signal.name != trigger.name:
        return False
    if signal.status is SignalStatus.RESOLVED and not trigger.include_resolved:
        return False
    for key, value in trigger.matchers.items():
        if signal.labels.get(key) != value:
            return False
    if trigger.target_label is not None:
        # The allowlist invariant: an alert about model B never acts on policy A's model.
        if signal.labels.get(trigger.target_label) != policy.target.model:
            return False
    return True


def matching_policies(policies: Iterable[LoadedPolicy], signal: Matchable) -> list[LoadedPolicy]:
    """The enabled policies that `signal` triggers, in load order."""
    out = []
    for policy in policies:
        if not policy.spec.enabled:
            continue
        if signal.source is SignalSource.ALERT:
            if any(t.alert is not None and alert_trigger_matches(t.alert, policy, signal)
                   for t in policy.spec.triggers):
                out.append(policy)
        elif signal.policy == policy.name:
            # Detector and schedule signals are produced for exactly one policy.
            out.append(policy)
    return out
