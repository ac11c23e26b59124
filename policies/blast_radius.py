"""Blast radius: limits across targets, decided from journaled history. Pure.

Two daemon-wide checks that a policy's own guards cannot make, since each policy sees one target:

- the target budget: at most `max_targets` distinct targets changed within a window. A target
  already changed in the window does not count twice, so a plan on it stays allowed;
- common-cause suppression: when more than a limit of distinct targets signal within a short span,
  the cause is likely shared (nodes, network, Prometheus itself) and rolling back each model would
  only add changes to an incident that is not theirs. No plan acts while the burst lasts; the
  first suppression of a burst asks the caller to escalate, later ones do not.

Times are unix seconds. An event is within a window of `w` seconds ending at `now` when its time is
after `now - w` (as the journal's guard history counts); a time after `now` (another replica's
clock) counts as within.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from policies.guards import GuardDecision

MAX_NAMED_TARGETS = 10  # targets a verdict names; the rest are counted ("and 3 more")


@dataclass(frozen=True)
class CommonCauseDecision(GuardDecision):
    """A GuardDecision that also says which targets signalled in the span and whether to escalate."""

    targets: int = 0  # distinct targets that signalled within the span
    named: tuple[str, ...] = ()  # the first MAX_NAMED_TARGETS of them, sorted
    escalate: bool = False  # suppressed, and the first suppression of this burst: escalate now


def _distinct_since(events: Iterable[tuple[str, float]], since: float) -> set[str]:
    return {target for target, at in events if at > since}


def _names(targets: set[str]) -> tuple[tuple[str, ...], str]:
    named = tuple(sorted(targets)[:MAX_NAMED_TARGETS])
    more = len(targets) - len(named)
    return named, ", ".join(named) + (f" and {more} more" if more else "")


def check_target_budget(executed: Iterable[tuple[str, float]], target: str, now: float,
                        window_seconds: float, max_targets: int | None) -> GuardDecision:
    """May a plan on `target` act now, given the (target, unix time) of executed plans?

    Blocked when `max_targets` distinct other targets were already changed within `window_seconds`
    before `now`; a target already in that set is allowed (it does not widen the blast radius).
    `max_targets` None: the budget is off.
    """
    if max_targets is None:
        return GuardDecision(True, "target budget off")
    if max_targets < 1 or window_seconds <= 0:
        raise ValueError("need max_targets >= 1 and window_seconds > 0")
    changed = _distinct_since(executed, now - window_seconds)
    if target in changed:
        return GuardDecision(True, f"target budget: {target} already changed in the last {window_seconds:.0f}s")
    if len(changed) >= max_targets:
        _, names = _names(changed)
        return GuardDecision(
            False,
            f"target budget: {len(changed)} targets changed in the last {window_seconds:.0f}s "
            f"(max {max_targets}): {names}",
        )
    return GuardDecision(True, f"target budget: {len(changed)} of {max_targets} targets changed "
                               f"in the last {window_seconds:.0f}s")


def check_common_cause(signals: Iterable[tuple[str, float]], now: float, span_seconds: float,
                       max_targets: int | None = None, max_share: float | None = None,
                       policy_targets: int = 0, last_suppressed_at: float | None = None) -> CommonCauseDecision:
    """Is a burst of signals on many targets under way, so that no plan should act now?

    `signals` are the (target, unix time) of recent signals; those within `span_seconds` before
    `now` count, each target once. Suppressed when their number is more than `max_targets`, or
    when their share of `policy_targets` (the number of targets the policies name) is more than
    `max_share`; either limit None is off, and both None turns the check off. While suppressed,
    every plan is blocked, on a target of the burst or not. `escalate` is True on the first
    suppression of a burst: when `last_suppressed_at` (the previous suppression) is None or not
    within the span.
    """
    if max_targets is None and max_share is None:
        return CommonCauseDecision(True, "common-cause check off")
    if span_seconds <= 0 or (max_targets is not None and max_targets < 1) \
            or (max_share is not None and not 0 < max_share < 1):
        raise ValueError("need span_seconds > 0, max_targets >= 1 and 0 < max_share < 1")
    signalled = _distinct_since(signals, now - span_seconds)
    count = len(signalled)
    named, names = _names(signalled)
    over: list[str] = []
    if max_targets is not None and count > max_targets:
        over.append(f"more than {max_targets}")
    if max_share is not None and policy_targets > 0 and count / policy_targets > max_share:
        over.append(f"more than {max_share:.0%} of the {policy_targets} targets policies name")
    if not over:
        return CommonCauseDecision(True, f"common cause: {count} target(s) signalled in the last "
                                         f"{span_seconds:.0f}s", count, named)
    escalate = last_suppressed_at is None or last_suppressed_at <= now - span_seconds
    return CommonCauseDecision(
        False,
        f"common cause suspected: {count} targets signalled in the last {span_seconds:.0f}s "
        f"({' and '.join(over)}): {names}; acting on none (nodes, network or Prometheus?)",
        count, named, escalate,
    )
