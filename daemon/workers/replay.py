"""Replaying history for `tailguard backtest`, pure: windows of pre-fetched series as the poller
would have read them at a past moment, and what the executor would have decided for each signal
(shadow, guards, approval, dry run) with the would-be actions as the only history.

Nothing here observes a target: a backtest cannot know a past target's state, so a would-be plan
names the policy's actions and parameters; the concrete steps are planned from the target's state
when the daemon runs them.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from core.query import Series, series_key
from core.signal import Signal
from daemon.workers.shadow import shadow_origin
from policies.guards import GuardState, check_guards
from policies.loader import LoadedPolicy
from policies.planning import recovery_check

MAX_POINTS_PER_QUERY = 10_000
"""Prometheus refuses range queries of more than 11,000 points per series; history is read in chunks."""


def chunks(start: float, end: float, step: float, max_points: int = MAX_POINTS_PER_QUERY) -> list[tuple[float, float]]:
    """[start, end] cut into consecutive ranges of at most `max_points` points on one grid
    (`start + k * step`), each chunk starting one step after the previous one ended."""
    out = []
    span = step * (max_points - 1)
    t = start
    while t <= end:
        stop = min(end, t + span)
        out.append((t, stop))
        t = stop + step if stop < end else end + step
    return out


def merge_series(parts: Iterable[Sequence[Series]]) -> list[Series]:
    """Chunks of one query joined per series (by labels), points in time order, duplicates dropped."""
    joined: dict[str, tuple[dict[str, str], dict[float, float]]] = {}
    for part in parts:
        for s in part:
            labels, points = joined.setdefault(series_key(s.labels), (dict(s.labels), {}))
            points.update(zip(s.timestamps, s.values))
    out = []
    for labels, points in joined.values():
        times = sorted(points)
        out.append(Series(labels, tuple(times), tuple(points[t] for t in times)))
    return out


def window(series: Sequence[Series], start: float, end: float, tolerance: float = 1e-3) -> list[Series]:
    """The points of each series within [start, end], as a range query over that span would answer;
    series with no point in it are left out (Prometheus returns no such series)."""
    out = []
    for s in series:
        lo = bisect.bisect_left(s.timestamps, start - tolerance)
        hi = bisect.bisect_right(s.timestamps, end + tolerance)
        if hi > lo:
            out.append(Series(s.labels, tuple(s.timestamps[lo:hi]), tuple(s.values[lo:hi])))
    return out


def describe_actions(policy: LoadedPolicy) -> str:
    """The policy's actions with the parameters written in it, e.g. `triton.rollback(to=previous)`."""
    parts = []
    for bound in policy.actions:
        params = bound.params.model_dump(mode="json", exclude_unset=True, by_alias=True)
        args = ", ".join(f"{k}={_short(v)}" for k, v in params.items())
        parts.append(f"{bound.kind}({args})")
    return "; ".join(parts)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class ReplayDecision:
    """What the daemon would have decided for one signal at `at`."""

    at: float
    policy: str
    target: str
    outcome: str  # act | blocked | shadow | dry_run | approval
    reason: str
    actions: str
    recovery: str | None = None

    @property
    def acts(self) -> bool:
        return self.outcome == "act"

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "policy": self.policy, "target": self.target, "outcome": self.outcome,
                "reason": self.reason, "actions": self.actions, "recovery": self.recovery}


@dataclass
class ReplayGuards:
    """The guards over a replay: cooldown and rate limit count only the plans the replay itself
    would have run (a backtest reads no journal); the config's freeze blocks all."""

    frozen: bool = False
    acted: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (policy, target) -> times

    def decide(self, policy: LoadedPolicy, signal: Signal, at: float, notify_only: str | None = None) -> ReplayDecision:
        """`notify_only`: why the governed alert rule (`policies.governance`) says the alert only
        notifies; weighed after the guards, as the ladder does (`daemon.workers.decide`)."""
        key = (policy.name, policy.target.key)
        actions = describe_actions(policy)
        shadow = shadow_origin(policy, signal)
        if shadow is not None:
            return ReplayDecision(at, policy.name, policy.target.key, "shadow",
                                  f"{shadow.label}: journaled as what would have been done, never applied", actions)
        past = self.acted.get(key, [])
        guards = policy.spec.guards
        window_start = at - guards.max_actions_window
        state = GuardState(past[-1] if past else None, sum(1 for t in past if t > window_start), self.frozen)
        verdict = check_guards(guards, state, at)
        if not verdict.allowed:
            return ReplayDecision(at, policy.name, policy.target.key, "blocked", verdict.reason, actions)
        if notify_only is not None:
            return ReplayDecision(at, policy.name, policy.target.key, "blocked", notify_only, actions)
        check = recovery_check(policy, signal)
        recovery = f"{check.query} {check.condition.describe()}" if check is not None else None
        if guards.dry_run:
            return ReplayDecision(at, policy.name, policy.target.key, "dry_run", "dryRun: planned, not applied",
                                  actions, recovery)
        # A plan that waits for approval counts for cooldown only once approved; assume it would be.
        self.acted.setdefault(key, []).append(at)
        if policy.spec.approval == "required":
            return ReplayDecision(at, policy.name, policy.target.key, "approval",
                                  "would wait for approval (counted as if approved)", actions, recovery)
        return ReplayDecision(at, policy.name, policy.target.key, "act", "guards passed", actions, recovery)

