"""daemon.cluster.kube: the client from settings, EndpointSlice discovery (ready endpoints only), Events."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from core.target import ServiceRef, Target
from daemon.common.config import KubernetesSettings
from daemon.cluster.kube import (create_api_client, endpoints_from_slices, endpoints_resolver, event_body,
                         event_recorder)
from policies.loader import load_policies_text
from daemon.wiring.registries import action_registry, detector_registry
from tests.support.kube.conftest_plugin import kube_api, kube_emulator  # noqa: F401  (fixtures)
from lab.kube.emulator import KubeEmulator
from tests.support.kube_helpers import write_kubeconfig

NS = "serving"


def endpoint_slice(name: str, service: str, endpoints: list[tuple[str, dict[str, Any]]],
                   port: int = 8000) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": service}},
        "ports": [{"name": "http", "port": port, "protocol": "TCP"},
                  {"name": "metrics", "port": 8002, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": cond} for ip, cond in endpoints],
    }


async def test_endpoint_slices_yield_only_ready_endpoints(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """Ready endpoints of every slice of the Service, on the ServiceRef's port; not ready,
    terminating and other services' endpoints are left out."""
    kube_emulator.seed(endpoint_slice("ranker-a", "ranker", [
        ("10.0.0.1", {"ready": True}), ("10.0.0.2", {"ready": False}),
        ("10.0.0.3", {"ready": True, "terminating": True})]))
    kube_emulator.seed(endpoint_slice("ranker-b", "ranker", [("10.0.0.4", {"ready": True}),
                                                              ("10.0.0.1", {"ready": True})]))
    kube_emulator.seed(endpoint_slice("other-a", "other", [("10.0.9.9", {"ready": True})]))
    ref = ServiceRef(NS, "ranker", 8000)
    assert await endpoints_from_slices(kube_api, ref) == ["http://10.0.0.1:8000", "http://10.0.0.4:8000"]
    assert await endpoints_from_slices(kube_api, ServiceRef(NS, "ranker", 9999)) == []
    (listed,) = kube_emulator.requests_for("list", "endpointslices")[:1]
    assert listed.query["labelSelector"] == "kubernetes.io/service-name=ranker"


async def test_endpoints_resolver_uses_static_urls_without_a_service() -> None:
    """Targets with static endpoints never touch the API."""
    resolve = endpoints_resolver(None)
    assert await resolve(Target("m", triton_endpoints=("http://127.0.0.1:8000",))) == ["http://127.0.0.1:8000"]


async def test_kubeconfig_mode_builds_a_working_client(tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """kubernetes.mode=kubeconfig loads the file; off gives None."""
    assert await create_api_client(KubernetesSettings()) is None
    api = await create_api_client(KubernetesSettings(mode="kubeconfig",
                                                     kubeconfig=write_kubeconfig(tmp_path / "kc", kube_emulator)))
    assert api is not None
    try:
        kube_emulator.seed(endpoint_slice("ranker-a", "ranker", [("10.0.0.1", {"ready": True})]))
        assert await endpoints_from_slices(api, ServiceRef(NS, "ranker")) == ["http://10.0.0.1:8000"]
    finally:
        await api.close()


POLICY = """
name: ranker-retune
target:
  model: ranker
  namespace: serving
  triton: {service: {namespace: serving, name: ranker-triton}}
triggers:
  - alert: {name: TritonTailLatencyHigh}
actions:
  - type: notify
    url: http://127.0.0.1:9/hook
# alert-only: a verify block is required; its outcome is irrelevant here (onNotRecovered: none)
verify: {query: 'vector(0)', below: 1, onNotRecovered: none}
"""


def _policy(text: str = POLICY) -> Any:
    return load_policies_text(text, "test.yaml", action_registry(), detector_registry()).policies[0]


async def test_event_is_recorded_on_the_target_service(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A core/v1 Event on the target's Triton Service, from component tailguard, schema-valid."""
    record = event_recorder(kube_api, "tailguard-0", clock=lambda: 1_800_000_000.0)
    await record(policy=_policy(), reason="Remediated", message="gateway.retune_timeout: 2s -> 6s",
                 warning=False)
    (event,) = kube_emulator.objects("events", NS)
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Service", "namespace": NS,
                                       "name": "ranker-triton"}
    assert event["type"] == "Normal" and event["reason"] == "Remediated"
    assert event["source"] == {"component": "tailguard"} and event["reportingComponent"] == "tailguard"
    assert event["count"] == 1 and event["firstTimestamp"] == event["lastTimestamp"] == "2027-01-15T08:00:00Z"
    assert "ranker-retune" in event["message"] and "2s -> 6s" in event["message"]


def test_event_falls_back_to_own_pod_or_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without triton.service the Event goes on tailguard's own Pod; with no Pod known, none."""
    policy = _policy(POLICY.replace("triton: {service: {namespace: serving, name: ranker-triton}}", ""))
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert event_body(policy, "Remediated", "m", True, "x", 0.0) is None
    monkeypatch.setenv("POD_NAME", "tailguard-7d9")
    monkeypatch.setenv("POD_NAMESPACE", "tailguard")
    body = event_body(policy, "RemediationFailed", "m", True, "x", 0.0)
    assert body is not None and body["type"] == "Warning"
    assert body["involvedObject"]["kind"] == "Pod" and body["metadata"]["namespace"] == "tailguard"


def test_replica_urls_count_the_replicas_that_are_not_ready():
    """All-or-nothing rollbacks count every replica: ready ones, and not-ready ones apart (down,
    starting); terminating ones are leaving and left out; the Service's own name never appears."""
    from types import SimpleNamespace as NS

    from core.target import ServiceRef
    from daemon.cluster.kube import replica_urls

    def ep(address: str, **conditions: bool) -> NS:
        return NS(addresses=[address], conditions=NS(ready=conditions.get("ready"),
                                                     terminating=conditions.get("terminating")))

    slices = [NS(metadata=NS(name="s1"), ports=[NS(name="http", port=8000)],
                 endpoints=[ep("10.0.0.1", ready=True), ep("10.0.0.2", ready=False), ep("10.0.0.3"),
                            ep("10.0.0.4", ready=False, terminating=True)])]
    found = replica_urls(slices, ServiceRef("serving", "triton", 8000, "http"))
    assert found.ready == ("http://10.0.0.1:8000", "http://10.0.0.3:8000")
    assert found.not_ready == ("http://10.0.0.2:8000",)
