"""The pin reconciler re-applies a journaled rollback pin to a replica that serves another version
(a new pod loads the newest version), found through EndpointSlices, against a real Triton.

A private Triton (not the shared one): pinning it leaves a config override that the shared
server's between-test reset does not reliably undo."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes_asyncio.client import ApiClient

from actions.base import ActionDeps
from daemon.workers.state import ExecutorState
from daemon.storage.journal import Journal
from daemon.cluster.kube import endpoints_resolver
from daemon.common.metrics import Metrics
from daemon.workers.context import ActContext
from daemon.workers.pins import PinReconciler
from daemon.wiring.registries import action_registry, detector_registry
from lab.triton import served_versions
from policies.loader import PolicySet, load_policies_text
from tests.support.kube.conftest_plugin import kube_api, kube_emulator  # noqa: F401  (fixtures)
from lab.kube.emulator import KubeEmulator

pytestmark = pytest.mark.integration

POLICY = """
name: ranker-tail
target:
  model: ranker
  namespace: serving
  triton: {service: {namespace: serving, name: ranker-triton, port: PORT}}
triggers:
  - alert: {name: TritonTailLatencyHigh, actsUngoverned: true}  # the alert rolls back on its own
actions:
  - type: triton.rollback
# alert-only: a verify block is required; its outcome is irrelevant here (onNotRecovered: none)
verify: {query: 'vector(0)', below: 1, onNotRecovered: none}
"""


async def test_pin_is_reapplied_to_a_replica_serving_the_newest_version(
        tmp_path: Path, triton_factory: Any, kube_api: ApiClient,  # noqa: F811
        kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """Pinned to v1 in the journal, the replica (from the Service's EndpointSlice) serves v2:
    a follower or a frozen leader does nothing; the leader loads v1 pinned; the next pass is in sync;
    a pin whose target no policy names ends (journaled with the reason)."""
    triton = await triton_factory(name="ranker")
    assert served_versions(triton) == ["2"]
    port = urlsplit(triton.base_url).port
    kube_emulator.seed({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "ranker-triton-x1", "namespace": "serving",
                     "labels": {"kubernetes.io/service-name": "ranker-triton"}},
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}},
                      {"addresses": ["127.0.0.2"], "conditions": {"ready": False}}],
    })
    journal = Journal(tmp_path / "journal.db")
    policies = load_policies_text(POLICY.replace("PORT", str(port)), "p.yaml", action_registry(),
                                  detector_registry())
    state = ExecutorState(PolicySet(policies.policies), frozen=True)
    metrics = Metrics()
    leader = {"v": False}
    reconciler = PinReconciler(ActContext(journal, state,
                                          ActionDeps(kube=kube_api, endpoints=endpoints_resolver(kube_api)), metrics,
                                          action_registry(), may_act=lambda: leader["v"]))
    try:
        journal.pins.record("serving/ranker", "ranker", 1)
        journal.pins.record("serving/gone", "gone", 3)
        assert await reconciler.reconcile_once() == {}  # not the leader: nothing at all

        leader["v"] = True
        frozen = await reconciler.reconcile_once()
        assert frozen["serving/ranker"].status.value == "skipped" and served_versions(triton) == ["2"]

        state.frozen = False
        results = await reconciler.reconcile_once()
        assert set(results) == {"serving/ranker"}
        assert [p.target for p in journal.pins.live()] == ["serving/ranker"]
        (gone,) = journal.pins.ended()
        assert gone.target == "serving/gone" and gone.ended_reason == "no policy targets serving/gone any more"
        assert results["serving/ranker"].status.value == "ok", results["serving/ranker"].message
        assert results["serving/ranker"].data["drifted"] == {f"http://127.0.0.1:{port}": [2]}
        assert served_versions(triton) == ["1"]

        again = await reconciler.reconcile_once()
        assert again["serving/ranker"].status.value == "noop"
        sample = metrics.registry.get_sample_value
        assert sample("tailguard_actions_total", {"action": "pin.reconcile", "result": "reapplied"}) == 1
        assert sample("tailguard_actions_total", {"action": "pin.reconcile", "result": "in_sync"}) == 1
    finally:
        journal.close()


def _door_reconciler(journal: Journal, base_url: str) -> PinReconciler:
    """The pin reconciler of POLICY on one Triton endpoint, its writes through the one door (freezes,
    bad marks and fences asked as the daemon asks them)."""
    from daemon.workers.door import Door

    policy = POLICY.replace("triton: {service: {namespace: serving, name: ranker-triton, port: PORT}}",
                            f"triton: {{endpoints: ['{base_url}']}}")
    policies = load_policies_text(policy, "p.yaml", action_registry(), detector_registry())
    state = ExecutorState(PolicySet(policies.policies))
    metrics = Metrics()
    deps = ActionDeps()
    deps.actuator = Door(journal, state, deps, lambda: True, metrics)
    return PinReconciler(ActContext(journal, state, deps, metrics, action_registry()))


async def test_a_daemon_frozen_through_the_runtime_freeze_does_not_re_pin_a_redeploy(
        tmp_path: Path, triton_factory: Any) -> None:
    """Issue 42 (a), on a real Triton: rolled back v2 -> v1 (the pin, v2 marked bad), the whole daemon
    frozen through the runtime freeze (the API's path), v2 redeployed by hand: the next pin pass loads
    nothing and journals the refusal (the unit twin, tests/unit/test_door.py, lifts it too)."""
    from daemon.storage.records import DAEMON_SCOPE
    from daemon.workers.freezes import FreezeControl
    from lab.triton import load_version

    triton = await triton_factory(name="ranker")
    journal = Journal(tmp_path / "journal.db")
    reconciler = _door_reconciler(journal, triton.base_url)
    try:
        journal.pins.record("serving/ranker", "ranker", 1, from_version=2, policy="ranker-tail")
        assert (await reconciler.reconcile_once())["serving/ranker"].ok  # the rollback's pin holds: v1
        assert await asyncio.to_thread(served_versions, triton) == ["1"]

        await FreezeControl(journal, Metrics(), False).freeze(DAEMON_SCOPE, "incident 42", "alice", "api")
        await load_version(triton, "ranker", None)  # the redeploy of v2, by hand
        assert await asyncio.to_thread(served_versions, triton) == ["2"]

        frozen = (await reconciler.reconcile_once())["serving/ranker"]
        assert frozen.status.value == "skipped" and frozen.data["refused"] == "freeze", frozen.message
        assert await asyncio.to_thread(served_versions, triton) == ["2"]
        refused = [r for r in journal.effects.of("serving/ranker") if r.status == "refused"]
        assert [(r.writer, r.data["check"]) for r in refused] == [("pins", "freeze")]
    finally:
        journal.close()


async def test_a_pod_serving_the_pinned_version_under_its_repository_latest_policy_is_not_reloaded_every_pass(
        tmp_path: Path, triton_factory: Any) -> None:
    """A pod that started while the repository held v1 as its newest (v2, rolled back from, taken out
    of it) serves v1 under Triton's default `latest` policy; v2 is put back in the folder later (not
    loaded: explicit control). A `specific [1]` load of the loaded v1 (its folder unchanged) is a
    config update that leaves the reported `latest` as it is, so a pin check reading that policy
    literally loaded v1 again on every pass. v1 alone is the pin in force: no pass loads anything."""
    import shutil

    from lab.triton import write_model_repository

    spare = write_model_repository(tmp_path / "spare", "ranker", slow_fraction_by_version={2: 0.0}, precompile=True)
    triton = await triton_factory(name="ranker", slow_fraction_by_version={1: 0.0}, precompile=True)
    assert await asyncio.to_thread(served_versions, triton) == ["1"]
    shutil.move(str(spare / "2"), str(triton.model_repository / "ranker" / "2"))
    journal = Journal(tmp_path / "journal.db")
    reconciler = _door_reconciler(journal, triton.base_url)
    try:
        journal.pins.record("serving/ranker", "ranker", 1, from_version=2, policy="ranker-tail")
        for _ in range(3):
            held = (await reconciler.reconcile_once())["serving/ranker"]
            assert held.status.value == "noop", held.message
        assert journal.effects.of("serving/ranker") == [], "a pass loaded v1 again: the pin looked drifted"
        assert await asyncio.to_thread(served_versions, triton) == ["1"]
        assert [p.version for p in journal.pins.live()] == [1]
    finally:
        journal.close()
