"""The Pinning protocol: triton.rollback offers the pin reconciler its pure pin planning, found in
the registry it is given; a registry without a pinning action re-applies no pin."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from actions.base import Action, ActionDeps, PinCheck, Pinning, pinning_action
from actions.notify import Notify
from actions.registry import ACTIONS
from actions.triton import TritonRollback, TritonRollbackParams
from core.target import Target
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.workers.context import ActContext
from daemon.workers.pins import PinReconciler, rolled_forward
from daemon.workers.state import ExecutorState
from policies.loader import PolicySet, load_policies_text

TARGET = Target("ranker", triton_endpoints=("http://a:8000",))


def _replica(ready: list[int], pinned: list[int] | None = None) -> dict[str, Any]:
    index = [{"name": "ranker", "version": str(v), "state": "READY" if v in ready else "UNAVAILABLE"}
             for v in (1, 2, 3)]
    policy = {"specific": {"versions": pinned}} if pinned else {"latest": {"num_versions": 1}}
    return {"index": index, "config": {"name": "ranker", "version_policy": policy}}


def test_the_registry_names_triton_rollback_as_its_pinning_action():
    """Found by what it offers, not by its module; none in a registry without it; two are an error."""
    assert pinning_action(ACTIONS) is TritonRollback
    assert isinstance(TritonRollback(ActionDeps()), Pinning) and not isinstance(Notify(ActionDeps()), Pinning)
    assert pinning_action({k: v for k, v in ACTIONS.items() if k != "triton.rollback"}) is None
    twin = type("Twin", (TritonRollback,), {"kind": "twin.rollback"})
    with pytest.raises(ValueError, match="more than one action pins versions: triton.rollback, twin.rollback"):
        pinning_action({**ACTIONS, "twin.rollback": twin})


def test_plan_pin_is_the_rollback_to_the_pinned_version_and_what_the_replicas_serve():
    """Pure: the step loads the pinned version on the drifted replica only; READY versions of every
    replica, the drift and the unreachable ones come with it."""
    action = TritonRollback(ActionDeps())
    params = action.pin_params(1)
    assert params == TritonRollbackParams(to=1)
    observed = {"replicas": {"http://a:8000": _replica([1], [1]), "http://b:8000": _replica([3])},
                "unreachable": {"http://c:8000": "refused"}}
    check = action.plan_pin(TARGET, params, observed)
    assert isinstance(check, PinCheck) and not check.step.noop
    assert check.step.after == {"version": 1, "replicas": {"http://b:8000": {"version": 1, "from": [3], "switch": "load"}},
                                "warm_ok": True}
    assert (check.ready_versions, check.drifted, check.replicas) == ((1, 3), {"http://b:8000": [3]}, 2)
    assert check.unreachable == {"http://c:8000": "refused"}
    held = action.plan_pin(TARGET, params, {"replicas": {"http://a:8000": _replica([1], [1])}})
    assert held.step.noop and held.drifted == {} and held.ready_versions == (1,)
    assert rolled_forward(check.ready_versions, 2) == [3] and rolled_forward(held.ready_versions, 2) == []
    assert rolled_forward(check.ready_versions, None) == []


def test_without_a_pinning_action_no_pin_is_reapplied_and_pins_still_end_with_their_policy():
    """A registry without a pinning action: the pin of a live policy is left (nothing observed),
    the pin of a removed policy still ends."""
    text = ("name: p\ntarget: {model: ranker, triton: {endpoints: ['http://127.0.0.1:9']}}\n"
            "triggers:\n  - alert: {name: A}\nactions:\n  - {type: notify, url: 'http://127.0.0.1:9/h'}\n"
            "verify: {query: up, below: 1}\n")
    registry: dict[str, type[Action]] = {"notify": Notify}
    policies = load_policies_text(text, "p.yaml", registry, {})
    journal = Journal(":memory:")
    try:
        journal.pins.record("default/ranker", "ranker", 1, policy="p")
        journal.pins.record("default/gone", "gone", 3, policy="q")
        reconciler = PinReconciler(ActContext(journal, ExecutorState(PolicySet(policies.policies)), ActionDeps(),
                                              Metrics(), registry))
        assert asyncio.run(reconciler.reconcile_once()) == {}
        assert [p.target for p in journal.pins.live()] == ["default/ranker"]
        (gone,) = journal.pins.ended()
        assert gone.target == "default/gone" and gone.ended_reason == "policy q removed"
    finally:
        journal.close()


class _FakeReplicas(TritonRollback):
    """triton.rollback's pure pin planning over one replica that serves version 3, unpinned; loads
    are recorded, not sent."""

    loads: list[Any] = []

    async def observe(self, target: Target, params: Any) -> dict[str, Any]:
        return {"replicas": {"http://a:8000": _replica([3])}, "unreachable": {}}

    async def apply(self, step: Any, target: Target, params: Any) -> Any:
        from core.outcome import Outcome
        self.loads.append((target.key, step.after["version"]))
        return Outcome.success("loaded")

    async def verify(self, step: Any, target: Target, params: Any) -> Any:
        from core.outcome import Outcome
        return Outcome.success("serves it")


def test_a_pin_outlives_a_rename_and_ends_only_when_no_policy_targets_it():
    """The pin names policy `old`; the policies now call it `new` (same target): the pin is carried on
    and re-applied, not ended. Once no policy targets the target at all, it ends as before."""
    def policy(name: str, model: str) -> str:
        return (f"name: {name}\ntarget: {{model: {model}, triton: {{endpoints: ['http://a:8000']}}}}\n"
                "triggers:\n  - alert: {name: A}\nactions:\n  - {type: triton.rollback}\n"
                "verify: {query: up, below: 1}\n")
    registry: dict[str, type[Action]] = {"triton.rollback": _FakeReplicas}
    state = ExecutorState(PolicySet(load_policies_text(policy("new", "ranker"), "p.yaml", registry, {}).policies))
    journal = Journal(":memory:")
    _FakeReplicas.loads = []
    try:
        journal.pins.record("default/ranker", "ranker", 1, from_version=3, policy="old")
        reconciler = PinReconciler(ActContext(journal, state, ActionDeps(), Metrics(), registry))
        results = asyncio.run(reconciler.reconcile_once())
        assert results["default/ranker"].ok, results
        assert _FakeReplicas.loads == [("default/ranker", 1)]
        assert [(p.target, p.policy) for p in journal.pins.live()] == [("default/ranker", "old")]
        assert journal.pins.ended() == []

        state.policies = PolicySet(load_policies_text(policy("new", "other"), "p.yaml", registry, {}).policies)
        assert asyncio.run(reconciler.reconcile_once()) == {}
        (ended,) = journal.pins.ended()
        assert ended.ended_reason == "policy old removed"
    finally:
        journal.close()


class _BrokenForOne(_FakeReplicas):
    """As _FakeReplicas, but reading the replicas of model `broken` raises what a restarting replica
    gives aiohttp (an error the action did not classify), as an unexpected bug would."""

    async def observe(self, target: Target, params: Any) -> dict[str, Any]:
        if target.model == "broken":
            import aiohttp
            raise aiohttp.ServerDisconnectedError()
        return await super().observe(target, params)


def test_one_targets_failure_never_stops_another_targets_pin():
    """Two pins; reconciling the first raises: it is counted and reported failed, and the second
    target's pin is still re-applied in the same pass."""
    text = "---\n".join(
        f"name: p-{m}\ntarget: {{model: {m}, triton: {{endpoints: ['http://a:8000']}}}}\n"
        "triggers:\n  - alert: {name: A}\nactions:\n  - {type: triton.rollback}\nverify: {query: up, below: 1}\n"
        for m in ("broken", "ranker"))
    registry: dict[str, type[Action]] = {"triton.rollback": _BrokenForOne}
    state = ExecutorState(PolicySet(load_policies_text(text, "p.yaml", registry, {}).policies))
    journal = Journal(":memory:")
    _FakeReplicas.loads = []
    metrics = Metrics()
    try:
        journal.pins.record("default/broken", "broken", 1, policy="p-broken")
        journal.pins.record("default/ranker", "ranker", 1, policy="p-ranker")
        reconciler = PinReconciler(ActContext(journal, state, ActionDeps(), metrics, registry))
        results = asyncio.run(reconciler.reconcile_once())
        assert not results["default/broken"].ok and "ServerDisconnectedError" in results["default/broken"].message
        assert results["default/ranker"].ok
        assert _FakeReplicas.loads == [("default/ranker", 1)]
        assert metrics.registry.get_sample_value("tailguard_faults_total", {"component": "pins"}) == 1
    finally:
        journal.close()
