"""The cooldown guard under clock skew between replicas: a last action stamped by a replica whose
clock runs ahead looks like it happened in the future (a negative elapsed time). It counts as just
now (0 s ago): a 0 s cooldown never blocks it, and a positive one still runs from the action's stamp."""
from __future__ import annotations

from policies.guards import GuardState, check_guards
from policies.schema import Guards


def test_a_negative_elapsed_time_does_not_block_a_zero_cooldown() -> None:
    g = Guards.model_validate({"cooldown": "0s", "maxActions": 5})
    decision = check_guards(g, GuardState(1002.0, 1), 1000.0)  # the last action 2 s "in the future"
    assert decision.allowed, decision.reason


def test_a_negative_elapsed_time_counts_as_zero_against_a_cooldown() -> None:
    g = Guards.model_validate({"cooldown": "10s", "maxActions": 5})
    decision = check_guards(g, GuardState(1002.0, 1), 1000.0)
    assert not decision.allowed
    assert decision.reason == "cooldown: last action 0s ago, cooldown is 10s"
    assert not check_guards(g, GuardState(1002.0, 1), 1011.0).allowed  # still counted from the stamp
    assert check_guards(g, GuardState(1002.0, 1), 1012.0).allowed
