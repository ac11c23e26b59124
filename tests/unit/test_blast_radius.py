"""Blast radius: the daemon-wide target budget and common-cause suppression with escalate-once."""
from __future__ import annotations

import pytest

from policies.blast_radius import (
    MAX_NAMED_TARGETS,
    CommonCauseDecision,
    check_common_cause,
    check_target_budget,
)
from policies.guards import GuardDecision

NOW = 10_000.0
HOUR = 3600.0


# ---- target budget -------------------------------------------------------------------------------


def test_budget_off_allows_anything():
    """max_targets None: the budget is off, whatever was changed."""
    executed = [(f"ns/m{i}", NOW - 1) for i in range(100)]
    decision = check_target_budget(executed, "ns/new", NOW, HOUR, None)
    assert decision == GuardDecision(True, "target budget off")


def test_below_the_budget_is_allowed():
    """Two of three targets changed: a third may act."""
    executed = [("ns/a", NOW - 10), ("ns/b", NOW - 20)]
    decision = check_target_budget(executed, "ns/c", NOW, HOUR, 3)
    assert decision.allowed
    assert "2 of 3" in decision.reason


def test_exactly_at_the_budget_blocks_a_new_target():
    """Three distinct targets changed with max 3: a fourth is blocked, the reason names them."""
    executed = [("ns/a", NOW - 10), ("ns/b", NOW - 20), ("ns/c", NOW - 30)]
    decision = check_target_budget(executed, "ns/d", NOW, HOUR, 3)
    assert not decision.allowed
    assert decision.reason == "target budget: 3 targets changed in the last 3600s (max 3): ns/a, ns/b, ns/c"


def test_a_target_changed_twice_counts_once():
    """Repeated actions on one target widen nothing: two distinct targets, max 3, a new one may act."""
    executed = [("ns/a", NOW - 10), ("ns/a", NOW - 100), ("ns/a", NOW - 1000), ("ns/b", NOW - 20)]
    assert check_target_budget(executed, "ns/c", NOW, HOUR, 3).allowed


def test_a_target_already_changed_is_allowed_at_the_budget():
    """The budget is spent, but T itself is one of the changed targets: allowed."""
    executed = [("ns/a", NOW - 10), ("ns/b", NOW - 20), ("ns/c", NOW - 30)]
    decision = check_target_budget(executed, "ns/b", NOW, HOUR, 3)
    assert decision.allowed
    assert "already changed" in decision.reason


def test_window_edges():
    """An action exactly `window` ago is out (as guard_history counts), one a second later is in."""
    assert check_target_budget([("ns/a", NOW - HOUR)], "ns/b", NOW, HOUR, 1).allowed
    assert not check_target_budget([("ns/a", NOW - HOUR + 1)], "ns/b", NOW, HOUR, 1).allowed


def test_an_action_stamped_after_now_counts():
    """Another replica's clock ahead of ours: its mark still counts (never an extra target)."""
    assert not check_target_budget([("ns/a", NOW + 5)], "ns/b", NOW, HOUR, 1).allowed


def test_budget_reason_names_a_bounded_list():
    """Many changed targets: the reason names the first ones, sorted, and counts the rest."""
    executed = [(f"ns/m{i:03d}", NOW - 1) for i in range(25)]
    decision = check_target_budget(executed, "ns/new", NOW, HOUR, 20)
    assert not decision.allowed
    assert f"and {25 - MAX_NAMED_TARGETS} more" in decision.reason
    assert "ns/m000" in decision.reason and "ns/m024" not in decision.reason


def test_budget_input_is_an_iterable():
    """A generator (journal rows mapped on the fly) is read once and works."""
    rows = [("p1", "ns/a", NOW - 1), ("p2", "ns/b", NOW - 2)]
    assert not check_target_budget(((t, at) for _, t, at in rows), "ns/c", NOW, HOUR, 2).allowed


@pytest.mark.parametrize(("window", "max_targets"), [(0, 1), (-1, 1), (HOUR, 0)])
def test_budget_rejects_nonsense_limits(window: float, max_targets: int):
    with pytest.raises(ValueError):
        check_target_budget([], "ns/a", NOW, window, max_targets)


# ---- common cause ---------------------------------------------------------------------------------


def _burst(n: int, at: float = NOW - 1) -> list[tuple[str, float]]:
    return [(f"ns/m{i:03d}", at) for i in range(n)]


def test_common_cause_off_allows():
    """No count and no share: off."""
    decision = check_common_cause(_burst(50), NOW, 60)
    assert decision.allowed and not decision.escalate
    assert decision.reason == "common-cause check off"


def test_exactly_at_the_count_is_not_suppressed():
    """The limit is 'more than': 5 targets with a limit of 5 act; 6 do not."""
    at_limit = check_common_cause(_burst(5), NOW, 60, max_targets=5)
    assert at_limit.allowed and at_limit.targets == 5 and not at_limit.escalate
    over = check_common_cause(_burst(6), NOW, 60, max_targets=5)
    assert not over.allowed
    assert over.targets == 6
    assert over.named == tuple(f"ns/m{i:03d}" for i in range(6))
    assert over.escalate
    assert "6 targets signalled in the last 60s (more than 5)" in over.reason


def test_signals_of_one_target_count_once():
    """Ten signals on two targets are two targets."""
    signals = [("ns/a", NOW - i) for i in range(5)] + [("ns/b", NOW - i) for i in range(5)]
    decision = check_common_cause(signals, NOW, 60, max_targets=1)
    assert decision.targets == 2 and not decision.allowed


def test_span_edges():
    """A signal exactly `span` ago is out, one a second later is in."""
    signals = _burst(2, at=NOW - 1) + [("ns/old", NOW - 60)]
    assert check_common_cause(signals, NOW, 60, max_targets=2).allowed
    signals = _burst(2, at=NOW - 1) + [("ns/recent", NOW - 59)]
    assert not check_common_cause(signals, NOW, 60, max_targets=2).allowed


def test_share_of_the_policy_targets():
    """Share 0.5 of 10 targets: 5 signalling is at the limit, 6 is over."""
    assert check_common_cause(_burst(5), NOW, 60, max_share=0.5, policy_targets=10).allowed
    over = check_common_cause(_burst(6), NOW, 60, max_share=0.5, policy_targets=10)
    assert not over.allowed
    assert "more than 50% of the 10 targets policies name" in over.reason


def test_share_at_a_decimal_limit_is_exact():
    """3 of 10 with share 0.3 is at the limit, not over (no float round-up)."""
    assert check_common_cause(_burst(3), NOW, 60, max_share=0.3, policy_targets=10).allowed


def test_share_without_policy_targets_never_suppresses():
    """No targets named by policies: a share cannot be computed and suppresses nothing."""
    assert check_common_cause(_burst(5), NOW, 60, max_share=0.1, policy_targets=0).allowed


def test_count_and_share_either_limit_suppresses():
    """Both given: the stricter one decides (count 10 vs share 0.2 of 20 = 4)."""
    by_share = check_common_cause(_burst(5), NOW, 60, max_targets=10, max_share=0.2, policy_targets=20)
    assert not by_share.allowed and "20%" in by_share.reason and "more than 10" not in by_share.reason
    by_count = check_common_cause(_burst(5), NOW, 60, max_targets=4, max_share=0.5, policy_targets=100)
    assert not by_count.allowed and "more than 4" in by_count.reason and "%" not in by_count.reason
    neither = check_common_cause(_burst(4), NOW, 60, max_targets=4, max_share=0.2, policy_targets=20)
    assert neither.allowed


def test_escalate_once_per_burst():
    """The first suppression escalates; one within the span of the previous does not; a suppression
    a full span after the previous one is a new burst and escalates again."""
    signals = _burst(6)
    first = check_common_cause(signals, NOW, 60, max_targets=5, last_suppressed_at=None)
    assert first.escalate
    again = check_common_cause(signals, NOW, 60, max_targets=5, last_suppressed_at=NOW - 59)
    assert not again.allowed and not again.escalate
    new_burst = check_common_cause(signals, NOW, 60, max_targets=5, last_suppressed_at=NOW - 60)
    assert not new_burst.allowed and new_burst.escalate


def test_no_escalation_when_not_suppressed():
    """A previous suppression long ago and a calm span now: allowed, nothing to escalate."""
    decision = check_common_cause(_burst(2), NOW, 60, max_targets=5, last_suppressed_at=NOW - 3600)
    assert decision.allowed and not decision.escalate


def test_named_list_is_bounded():
    """A burst over hundreds of targets names the first few, sorted, and counts the rest."""
    decision = check_common_cause(_burst(300), NOW, 60, max_targets=5)
    assert decision.targets == 300
    assert len(decision.named) == MAX_NAMED_TARGETS
    assert decision.named == tuple(sorted(decision.named))
    assert f"and {300 - MAX_NAMED_TARGETS} more" in decision.reason


def test_common_cause_decision_is_a_frozen_guard_decision():
    """The executor's guard can return it as is (blocked_plan reads allowed and reason)."""
    decision = check_common_cause(_burst(6), NOW, 60, max_targets=5)
    assert isinstance(decision, GuardDecision) and isinstance(decision, CommonCauseDecision)
    with pytest.raises(AttributeError):
        decision.allowed = True  # type: ignore[misc]


@pytest.mark.parametrize("kwargs", [
    {"span_seconds": 0, "max_targets": 1},
    {"span_seconds": 60, "max_targets": 0},
    {"span_seconds": 60, "max_share": 0.0},
    {"span_seconds": 60, "max_share": 1.0},
])
def test_common_cause_rejects_nonsense_limits(kwargs):
    with pytest.raises(ValueError):
        check_common_cause([], NOW, **kwargs)
