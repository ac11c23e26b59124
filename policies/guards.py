"""Guards: cooldown, rate limit and the global freeze, decided from journaled history. Pure."""
from __future__ import annotations

from dataclasses import dataclass

from policies.schema import Guards


@dataclass(frozen=True)
class GuardState:
    """What the journal says about past actions of one policy on one target."""

    last_action_at: float | None  # unix seconds of the last executed (not dry-run) plan
    actions_in_window: int  # executed plans within guards.max_actions_window
    frozen: bool = False  # the global freeze switch


@dataclass(frozen=True)
class GuardDecision:
    allowed: bool
    reason: str


def check_guards(guards: Guards, state: GuardState, now: float) -> GuardDecision:
    """May the policy act now? The first guard that says no gives the reason."""
    if state.frozen:
        return GuardDecision(False, "global freeze is on")
    if state.last_action_at is not None:
        # Never negative: another replica's clock may run ahead of ours (its action looks "in the
        # future"); that is no reason to block a 0 s cooldown, nor to say "-2s ago".
        since = max(0.0, now - state.last_action_at)
        if since < guards.cooldown:
            return GuardDecision(
                False, f"cooldown: last action {since:.0f}s ago, cooldown is {guards.cooldown:.0f}s"
            )
    if state.actions_in_window >= guards.max_actions:
        return GuardDecision(
            False,
            f"rate limit: {state.actions_in_window} actions in the last "
            f"{guards.max_actions_window:.0f}s (max {guards.max_actions})",
        )
    return GuardDecision(True, "guards passed")
