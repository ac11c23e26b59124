"""Pins follow new pods at once: after a rollback, a Triton replica that joins the Service (a new
pod) or comes back ready after a restart serves the pinned version through the EndpointSlice
watch, before the pin reconciler's next periodic pass would have reached it.

Two real Tritons stand for two pods of one Service: the same port on 127.0.0.1 and 127.0.0.2,
listed in one EndpointSlice of the Kubernetes API emulator. The periodic pass runs every 600 s:
the ordering assertion is that each replica served the pinned version while that pass had not
run again (`passes` unchanged, its due time still ahead); bench/bench_pin_follow.py times it.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.kube.emulator import KubeEmulator
from lab.policies import PAGE_ALERT_TRIGGER, rollback_policy
from lab.triton import TritonServer, served_versions, write_model_repository
from tests.support.helpers import local_settings, post_alerts, sample_payload, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from tests.support.kube_helpers import kube_settings, write_kubeconfig

pytestmark = pytest.mark.integration

NS, SERVICE, SLICE = "default", "ranker-triton", "ranker-triton-x1"
INTERVAL = 600.0


def service_policy(port: int) -> str:
    return rollback_policy("X", triggers=PAGE_ALERT_TRIGGER, guards="cooldown: 0s").replace(
        'triton: {endpoints: ["X"]}', f"triton: {{service: {{namespace: {NS}, name: {SERVICE}, port: {port}}}}}")


def endpoint_slice(port: int, ready: dict[str, bool]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": SLICE, "namespace": NS, "labels": {"kubernetes.io/service-name": SERVICE}},
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": r}} for ip, r in ready.items()]}


def set_ready(ready: dict[str, bool]) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        obj["endpoints"] = [{"addresses": [ip], "conditions": {"ready": r}} for ip, r in ready.items()]
    return change


async def _served(server: TritonServer) -> list[str]:
    return await asyncio.to_thread(served_versions, server)


def _reapplied(svc: Service) -> float:
    return svc.metrics.registry.get_sample_value(
        "tailguard_actions_total", {"action": "pin.reconcile", "result": "reapplied"}) or 0.0


async def _until_pinned(svc: Service, server: TritonServer, passes: int, reapplied: int) -> float:
    """Wait (bounded) until `server` serves only version 1 and the re-apply that loaded it has
    ended (verified and counted: the next step restarts the pod, which would fail a verify still
    reading it); the monotonic time it was seen so, checked to come before the periodic pass."""
    deadline = time.monotonic() + 120
    while await _served(server) != ["1"] or _reapplied(svc) < reapplied:
        assert time.monotonic() < deadline, (f"{server.base_url} never served the pinned version",
                                             _reapplied(svc), reapplied)
        await asyncio.sleep(0.05)
    seen = time.monotonic()
    assert svc.pins.passes == passes and seen < svc.pins.next_pass_at, (
        "served the pinned version only after a periodic pass", svc.pins.passes, passes)
    return seen


async def test_a_replica_added_or_restarted_after_a_rollback_serves_the_pinned_version_before_the_next_pass(
        tmp_path: Path, triton_factory: Any, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    first = await triton_factory(name="ranker")
    port = first.http_port
    kube_emulator.seed(endpoint_slice(port, {"127.0.0.1": True}))
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "ranker.yaml").write_text(service_policy(port))
    settings = local_settings(tmp_path, policies, kubernetes=kube_settings(write_kubeconfig(tmp_path / "kc", kube_emulator)),
                              executor={"workers": 2, "pinReconcileIntervalSeconds": INTERVAL})
    root = tmp_path / "second"
    second = TritonServer(write_model_repository(root / "models", name="ranker").parent, models=["ranker"],
                          workdir=root, host="127.0.0.2")
    second.http_port = port  # the Service's port, on the second pod's address
    try:
        async with Service(settings, action_registry(), detector_registry()) as svc:
            assert (await post_alerts(svc, sample_payload())).status == 200
            await svc.drain()
            assert await _served(first) == ["1"]  # rolled back and pinned
            assert [p.version for p in await svc.journal.pins.live.in_thread()] == [1]
            await wait_for(lambda: kube_emulator.watchers >= 1, timeout=30)
            passes = svc.pins.passes

            await asyncio.to_thread(second.start)  # a new pod: loads the newest version
            assert await _served(second) == ["2"]
            kube_emulator.modify("endpointslices", NS, SLICE, set_ready({"127.0.0.1": True, "127.0.0.2": True}))
            await _until_pinned(svc, second, passes, reapplied=1)

            # A restart: the pod goes unready, its Triton starts again on the newest version, ready again.
            kube_emulator.modify("endpointslices", NS, SLICE, set_ready({"127.0.0.1": True, "127.0.0.2": False}))
            await asyncio.to_thread(second.restart)
            assert await _served(second) == ["2"]
            kube_emulator.modify("endpointslices", NS, SLICE, set_ready({"127.0.0.1": True, "127.0.0.2": True}))
            await _until_pinned(svc, second, passes, reapplied=2)

            assert await _served(first) == ["1"]
            assert _reapplied(svc) == 2  # once per replica event, no more
    finally:
        await asyncio.to_thread(second.stop)
