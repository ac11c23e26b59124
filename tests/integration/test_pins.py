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
    locks: dict[str, asyncio.Lock] = {}
    reconciler = PinReconciler(journal, state,
                               ActionDeps(kube=kube_api, endpoints=endpoints_resolver(kube_api)), metrics,
                               lambda: leader["v"], lambda key: locks.setdefault(key, asyncio.Lock()),
                               actions=action_registry())
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
        assert [p["target"] for p in journal.pins.live()] == ["serving/ranker"]
        (gone,) = journal.pins.ended()
        assert gone["target"] == "serving/gone" and gone["ended_reason"] == "no policy targets serving/gone any more"
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
