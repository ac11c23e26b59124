"""All or nothing per target, against three real Triton replicas, each behind a TCP proxy the test
controls (lab/fault_proxy.py): one replica down, one refusing the load, one restarting mid-load.

The rule: every replica that answers ends on the target version with the pin recorded (a replica
down is pinned when it returns), or every replica is put back on what it served; never half. Each
test reads what every real server serves (not through its proxy) and what the journal says."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.fault_proxy import FaultProxy
from lab.kube.emulator import KubeEmulator
from lab.kube.seeds import kube_settings, write_kubeconfig
from lab.ports import free_port
from lab.policies import ALERT_ONLY_VERIFY, PAGE_ALERT_TRIGGER
from lab.triton import TritonServer, served_versions
from tests.support.helpers import local_settings, post_alerts, sample_payload
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

LOAD = b"/v2/repository/models/ranker/load"
KEY = "default/ranker"


def _policy(urls: list[str], on_failure: str = "stop") -> str:
    endpoints = ", ".join(f'"{u}"' for u in urls)
    return f"""
name: ranker-tail
target:
  model: ranker
  triton: {{endpoints: [{endpoints}]}}
triggers:
{PAGE_ALERT_TRIGGER}actions:
  - type: triton.rollback
guards: {{cooldown: 0s, onFailure: {on_failure}}}
{ALERT_ONLY_VERIFY}"""


class Replicas:
    """Three Tritons serving ranker v2 (v1 is the good version), each behind its own proxy."""

    def __init__(self, servers: list[TritonServer], proxies: list[FaultProxy]) -> None:
        self.servers, self.proxies = servers, proxies

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.proxies]

    async def served(self) -> list[list[str]]:
        """What each real server serves, read directly (not through its proxy)."""
        return [await asyncio.to_thread(served_versions, s, "ranker") for s in self.servers]


PODS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")  # one address per replica, one port: as pods behind a Service


@pytest.fixture
async def replicas(triton_factory: Any) -> AsyncIterator[Replicas]:
    servers = await asyncio.gather(*(triton_factory(name="ranker", instances=1) for _ in range(3)))
    port = free_port()
    proxies = [await FaultProxy("127.0.0.1", s.http_port, port=port, host=pod).start()
               for s, pod in zip(servers, PODS)]
    try:
        yield Replicas(list(servers), proxies)
    finally:
        for proxy in proxies:
            await proxy.close()


async def _service(tmp_path: Path, policy: str, **settings_: Any) -> Service:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "ranker.yaml").write_text(policy)
    settings = local_settings(tmp_path, pol, executor={"workers": 1, "pinReconcileIntervalSeconds": 3600,
                                                       "tritonTimeoutSeconds": 5}, **settings_)
    return Service(settings, action_registry(), detector_registry())


async def _rollback(svc: Service) -> Any:
    assert (await post_alerts(svc, sample_payload())).status == 200
    await svc.drain()
    (decision,) = await svc.journal.decisions.all.in_thread()
    return decision


async def test_one_replica_down_rolls_back_the_others_pinned_and_the_down_one_when_it_returns(
        tmp_path: Path, replicas: Replicas) -> None:
    """Replica C is down (connections refused) for the whole decision: A and B roll back, verify says
    so naming C, the pin is recorded; when C returns the pin reconciler brings it over. At no point
    does a replica that answers serve the bad version beside one that serves the good one."""
    a, b, c = replicas.proxies
    await c.down()
    async with await _service(tmp_path, _policy(replicas.urls)) as svc:
        decision = await _rollback(svc)
        assert decision.state == "succeeded", decision.reason
        assert await replicas.served() == [["1"], ["1"], ["2"]]  # C is down: nobody reaches its v2
        step = decision.plan["steps"][0]
        assert step["after"]["version"] == 1 and set(step["before"]["unreachable"]) == {c.url}
        assert "1 down: the pin brings them over when they return" in step["summary"]
        rows = await svc.journal.decisions.steps.in_thread(decision.id)
        (apply,) = [r for r in rows if r.phase == "apply"]
        assert apply.data["moved"] == sorted([a.url, b.url]) and set(apply.data["down"]) == {c.url}
        (verify,) = [r for r in rows if r.phase == "verify"]
        assert verify.message == "ranker serves only version 1 on the 2 replica(s) that answer; 1 down: pinned " \
                                    "when they return"
        (pin,) = await svc.journal.pins.live.in_thread()
        assert (pin.version, pin.from_version) == (1, 2)

        await c.up()
        results = await svc.pins.reconcile_once()
        assert results[KEY].ok, results[KEY].message
        assert results[KEY].data["drifted"] == {c.url: [2]}
        assert await replicas.served() == [["1"], ["1"], ["1"]]
        assert a.count(LOAD) == b.count(LOAD) == c.count(LOAD) == 1  # one load each, none repeated


async def test_a_replica_refusing_the_load_puts_the_others_back_never_half(tmp_path: Path,
                                                                           replicas: Replicas) -> None:
    """Replica C answers reads but every load request to it is cut before it reaches Triton (it
    refuses mid-load): after each attempt the replicas that moved are put back, the executor retries
    (3 attempts), and the decision fails with every replica on what it served. No pin, no bad mark."""
    a, b, c = replicas.proxies
    c.cut_on(LOAD, times=None)
    async with await _service(tmp_path, _policy(replicas.urls)) as svc:
        decision = await _rollback(svc)
        assert decision.state == "failed"
        assert "refused on 1 of 3 replica(s); the 2 that moved were put back" in decision.reason
        assert await replicas.served() == [["2"], ["2"], ["2"]]
        applies = [r for r in await svc.journal.decisions.steps.in_thread(decision.id) if r.phase == "apply"]
        assert len(applies) == 3  # retried: MAX_APPLY_ATTEMPTS
        for row in applies:
            assert row.status == "failed" and row.data["retryable"] is True
            assert set(row.data["refused"]) == {c.url}
            assert row.data["put_back"] == sorted([a.url, b.url]) and row.data["not_put_back"] == {}
        assert await svc.journal.pins.live.in_thread() == []
        assert await svc.journal.bad_versions.known.in_thread(KEY) == frozenset()


async def test_a_replica_restarting_mid_load_is_retryable_not_a_bug(tmp_path: Path, replicas: Replicas) -> None:
    """Replica C drops the connection right after its load request reached Triton and stays away for
    a moment (a restart): the client's ServerDisconnectedError is read as a replica down, not as a bug
    of the action; the others roll back, the pin is recorded, and once C is back it is in sync."""
    a, b, c = replicas.proxies
    c.cut_on(LOAD, times=1, after=True, down_for_seconds=3)
    async with await _service(tmp_path, _policy(replicas.urls)) as svc:
        decision = await _rollback(svc)
        assert decision.state == "succeeded", decision.reason
        rows = await svc.journal.decisions.steps.in_thread(decision.id)
        (apply,) = [r for r in rows if r.phase == "apply"]
        assert "exception" not in apply.data, apply.data
        assert apply.data["moved"] == sorted([a.url, b.url])
        assert apply.data["down"][c.url].startswith("ServerDisconnectedError"), apply.data["down"]
        assert svc.metrics.registry.get_sample_value("tailguard_faults_total", {"component": "actions"}) is None
        assert len(await svc.journal.pins.live.in_thread()) == 1
        for _ in range(100):
            if c.is_up:
                break
            await asyncio.sleep(0.1)
        results = await svc.pins.reconcile_once()
        assert results[KEY].ok, results[KEY].message
        assert await replicas.served() == [["1"], ["1"], ["1"]]


def _slice(port: int, ready: tuple[bool, bool, bool]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "ranker-triton-x1", "namespace": "serving",
                         "labels": {"kubernetes.io/service-name": "ranker-triton"}},
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [pod], "conditions": {"ready": up}} for pod, up in zip(PODS, ready)]}


async def test_a_replica_the_endpointslices_list_not_ready_is_counted_and_pinned_when_ready(
        tmp_path: Path, replicas: Replicas, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """The target names a Service: its EndpointSlice lists three pods, the third not ready (it crashed:
    not ready and unreachable). Discovery answers slowly (emulator latency); the rollback counts the
    third (down), rolls the other two back and pins. A pin pass whose discovery fails (emulator 500)
    reports that target failed; once the pod is back and ready, the next pass brings it over."""
    a, b, c = replicas.proxies
    await c.down()
    kube_emulator.seed(_slice(a.port, (True, True, False)))
    kube_emulator.inject("list", "endpointslices", latency_seconds=0.3)
    policy = _policy([]).replace("triton: {endpoints: []}",
                                 f"namespace: serving\n  triton: {{service: {{namespace: serving, name: ranker-triton, "
                                 f"port: {a.port}}}}}")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    async with await _service(tmp_path, policy, kubernetes=kube_settings(kubeconfig)) as svc:
        decision = await _rollback(svc)
        assert decision.state == "succeeded", decision.reason
        step = decision.plan["steps"][0]
        assert step["before"]["unreachable"] == {c.url: "not ready (EndpointSlice)"}
        assert sorted(step["before"]["replicas"]) == sorted([a.url, b.url])
        assert await replicas.served() == [["1"], ["1"], ["2"]]
        assert c.count(b"HTTP/1.1") == 0  # nothing reached it
        assert len(await svc.journal.pins.live.in_thread()) == 1

        failing = kube_emulator.inject("list", "endpointslices", status=500, times=1)
        results = await svc.pins.reconcile_once()
        assert failing.fired == 1 and not results["serving/ranker"].ok
        await c.up()
        kube_emulator.modify("endpointslices", "serving", "ranker-triton-x1",
                             lambda s: s["endpoints"][2].update(conditions={"ready": True}))
        results = await svc.pins.reconcile_once()
        assert results["serving/ranker"].ok, results["serving/ranker"].message
        assert await replicas.served() == [["1"], ["1"], ["1"]]
