"""What a replica read shows pinned after a warm switch (issue 44): Triton reports the config a version
was loaded with, so after the switch `[P, N]` -> `[P]` the replica serves P alone and reports `[P, N]`.
That is the pin in force (a re-pin would not change the report: it would be a load every pass), and
a second rollback sees it as pinned (not "no earlier version", nor a walk below P)."""
from __future__ import annotations

from typing import Any

import pytest

from actions.base import ActionDeps
from actions._triton_versions import in_place, pin_in_force
from actions.triton import TritonRollback, TritonRollbackParams, plan_rollback
from core.target import Target

TARGET = Target("ranker", triton_endpoints=("http://a:8000",))


def _replica(ready: list[int], policy: Any) -> dict[str, Any]:
    """A replica read: `policy` a list (`specific`), "all", or None (`latest`, Triton's default)."""
    index = [{"name": "ranker", "version": str(v), "state": "READY" if v in ready else "UNAVAILABLE"}
             for v in (1, 2, 3)]
    version_policy = ({"specific": {"versions": policy}} if isinstance(policy, list)
                      else {"all": {}} if policy == "all" else {"latest": {"num_versions": 1}})
    return {"index": index, "config": {"name": "ranker", "version_policy": version_policy}}


@pytest.mark.parametrize("ready, policy, pinned", [
    ([1], [1, 2], [1]),        # after the warm switch: the report lags, P alone is in force
    ([2], [1, 2], [2]),
    ([1], [1], [1]),
    ([1], None, None),         # latest: not pinned, whatever it serves
    ([1], [2, 3], [2, 3]),     # serves a version the policy does not name: the report as it is
    ([1, 2], [1, 2], [1, 2]),  # a warm set: the report as it is
    ([], [1], [1]),
])
def test_pin_in_force_is_the_served_version_where_the_report_names_it(
        ready: list[int], policy: Any, pinned: list[int] | None) -> None:
    assert pin_in_force(_replica(ready, policy), "ranker") == pinned


def test_in_place_after_the_warm_switch_and_not_where_the_version_is_not_pinned() -> None:
    switched = _replica([1], [1, 2])
    assert in_place(switched, "ranker", 1, warm_ok=False) and in_place(switched, "ranker", 1, warm_ok=True)
    assert not in_place(switched, "ranker", 2, warm_ok=True)
    # Serving the version alone with a `latest` report: in place (a load would not change the report).
    assert in_place(_replica([1], None), "ranker", 1, warm_ok=True)
    assert not in_place(_replica([1], [2, 3]), "ranker", 1, warm_ok=False)
    # A warm set still counts only with `warm_ok` and its report pinned to exactly those two.
    assert in_place(_replica([1, 2], [1, 2]), "ranker", 2, warm_ok=True)
    assert not in_place(_replica([1, 2], [1, 2]), "ranker", 2, warm_ok=False)
    assert not in_place(_replica([1, 2], [2]), "ranker", 2, warm_ok=True)


def test_the_pin_check_after_the_warm_switch_is_a_noop_and_a_second_rollback_finds_the_pin() -> None:
    action = TritonRollback(ActionDeps())
    observed = {"replicas": {"http://a:8000": _replica([1], [1, 2]), "http://b:8000": _replica([1], [1])},
                "known_bad": [2]}
    check = action.plan_pin(TARGET, action.pin_params(1), observed)
    assert check.step.noop and check.drifted == {}, check.step.summary
    # v1 the oldest: "already pinned", not "served version 1 has no earlier good version".
    step = plan_rollback(TARGET, TritonRollbackParams(), observed, frozenset({2}))
    assert step.noop and step.after["version"] == 1, step.summary
    # Three versions, switched from [2, 3] to 2: a second rollback stays on 2, it does not walk to 1.
    three = {"replicas": {"http://a:8000": _replica([2], [2, 3])}, "known_bad": [3]}
    again = plan_rollback(TARGET, TritonRollbackParams(), three, frozenset({3}))
    assert again.noop and again.after["version"] == 2, again.summary
    # A replica a new pod brought up on the newest version is still drift, moved by a load.
    drifted = action.plan_pin(TARGET, action.pin_params(1), {"replicas": {"http://a:8000": _replica([2], None)}})
    assert not drifted.step.noop and drifted.drifted == {"http://a:8000": [2]}


@pytest.mark.parametrize("policy", [None, "all"])
def test_a_replica_serving_the_pinned_version_alone_holds_the_pin_whatever_its_policy_string(policy: Any) -> None:
    """A pod that loaded the repository's `latest` (or `all`) policy while the repository held the
    pinned version as its newest (the bad one removed, a restart) serves the pin. A `specific [1]`
    load of the loaded version 1 is a config update that leaves the report as it is (docs/stack-facts.md,
    "The config Triton reports lags a switch"), so a check that read the policy string re-loaded it
    every pass: the pin is in force when what is served equals it."""
    action = TritonRollback(ActionDeps())
    observed = {"replicas": {"http://a:8000": _replica([1], policy)}, "known_bad": [2]}
    check = action.plan_pin(TARGET, action.pin_params(1), observed)
    assert check.step.noop and check.drifted == {}, check.step.summary
    # Serving something else than the pin is still drift, whatever the policy string.
    moved = action.plan_pin(TARGET, action.pin_params(1), {"replicas": {"http://a:8000": _replica([2], policy)}})
    assert not moved.step.noop and moved.drifted == {"http://a:8000": [2]}
    both = action.plan_pin(TARGET, action.pin_params(1), {"replicas": {"http://a:8000": _replica([1, 2], policy)}})
    assert not both.step.noop and both.drifted == {"http://a:8000": [1, 2]}


@pytest.mark.parametrize("policy", [None, "all"])
def test_a_fresh_deploy_under_latest_is_not_read_as_pinned_by_the_rollback(policy: Any) -> None:
    """What stays literal: without a pin to compare with, a replica serving one version under a
    `latest`/`all` policy is a deploy, not a rollback already made. Read as pinned, the rollback of a
    bad version 2 deployed alone would be "already pinned to version 2" and roll nothing back."""
    assert pin_in_force(_replica([2], policy), "ranker") is None
    step = plan_rollback(TARGET, TritonRollbackParams(), {"replicas": {"http://a:8000": _replica([2], policy)}})
    assert not step.noop and step.after["version"] == 1, step.summary
