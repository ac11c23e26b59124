"""Freezing through the control ConfigMap (`kubectl patch` / `kubectl edit`), read by the daemon from
the Kubernetes API emulator, with who from the emulator's managedFields, which it records as the API
server does (manager from `fieldManager`, else the User-Agent's product; ownership moves with the
fields a write changes)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import aiohttp
import pytest

from daemon.cluster.control_configmap import declared_freezes, manager_of
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.kube.emulator import KubeEmulator
from tests.integration.test_operator_api import OPERATOR, TOKENS, alert, call, last_decision
from tests.support.helpers import NotifySink, local_settings, notify_policy, wait_for
from tests.support.kube_helpers import kube_settings, write_kubeconfig

NS, NAME = "tailguard", "tailguard-control"
KUBECTL_UA = "kubectl/v1.30.2 (linux/amd64) kubernetes/3968350"
POLICY = notify_policy("URL")


@pytest.fixture(autouse=True)
def api_tokens_env() -> Iterator[None]:
    os.environ["TAILGUARD_API_TOKENS"] = TOKENS
    yield
    os.environ.pop("TAILGUARD_API_TOKENS", None)


async def kubectl_patch(emulator: KubeEmulator, data: dict[str, str], field_manager: str | None) -> dict[str, Any]:
    """A merge patch of the control ConfigMap's data as kubectl sends it."""
    query = f"?fieldManager={field_manager}" if field_manager else ""
    async with aiohttp.ClientSession() as http:
        async with http.patch(f"{emulator.url}/api/v1/namespaces/{NS}/configmaps/{NAME}{query}", json={"data": data},
                              headers={"Content-Type": "application/merge-patch+json", "User-Agent": KUBECTL_UA}) as resp:
            assert resp.status == 200, await resp.text()
            return dict(await resp.json())


# ---- the emulator's managedFields ------------------------------------------------------------------


async def test_emulator_records_managed_fields_like_the_api_server(kube_emulator: KubeEmulator) -> None:
    """Create by helm (fieldManager), a patch of one key by kubectl-patch, one by the User-Agent's
    product: each manager owns what it changed last; a write that changes nothing records nothing."""
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{kube_emulator.url}/api/v1/namespaces/{NS}/configmaps?fieldManager=helm",
                             json={"metadata": {"name": NAME, "labels": {"app": "tailguard"}},
                                   "data": {"freeze": "false", "freezeTargets": ""}}) as resp:
            assert resp.status == 201
            (created,) = (await resp.json())["metadata"]["managedFields"]
    assert created["manager"] == "helm" and created["operation"] == "Update" and created["apiVersion"] == "v1"
    assert created["fieldsV1"] == {"f:data": {".": {}, "f:freeze": {}, "f:freezeTargets": {}},
                                   "f:metadata": {"f:labels": {".": {}, "f:app": {}}}}
    patched = await kubectl_patch(kube_emulator, {"freeze": "true"}, "kubectl-patch")
    managed = {e["manager"]: e for e in patched["metadata"]["managedFields"]}
    assert managed["kubectl-patch"]["fieldsV1"] == {"f:data": {"f:freeze": {}}}
    assert "f:freeze" not in managed["helm"]["fieldsV1"]["f:data"]
    patched = await kubectl_patch(kube_emulator, {"freezeTargets": "ranker"}, None)
    assert manager_of("freezeTargets", patched["metadata"]["managedFields"]) == "kubectl"  # from the User-Agent
    assert manager_of("freeze", patched["metadata"]["managedFields"]) == "kubectl-patch"
    rv = patched["metadata"]["resourceVersion"]
    same = await kubectl_patch(kube_emulator, {"freezeTargets": "ranker"}, "someone-else")
    assert same["metadata"]["resourceVersion"] == rv
    assert "someone-else" not in {e["manager"] for e in same["metadata"]["managedFields"]}


def test_declared_freezes_fail_safe_and_skip_bad_targets() -> None:
    managed = [{"manager": "kubectl-edit", "operation": "Update", "time": "2026-01-01T00:00:00Z",
                "fieldsV1": {"f:data": {"f:freeze": {}, "f:freezeTargets": {}}}}]
    out, problems = declared_freezes({"freeze": "maybe", "freezeTargets": "ranker, serving/x  bad//y"},
                                     managed, "ns/cm")
    assert [(s, b) for s, _, b in out] == [("*", "kubectl-edit"), ("default/ranker", "kubectl-edit"),
                                           ("serving/x", "kubectl-edit")]
    assert "read as true" in out[0][1] and problems == ["freezeTargets: 'bad//y' is not namespace/model; skipped"]
    assert declared_freezes({"freeze": "false", "freezeTargets": ""}, managed, "ns/cm") == ([], [])


def test_declared_freezes_skip_a_target_no_policy_names() -> None:
    """#42 bad input: given the targets the policies name, a freezeTargets entry naming another one is
    a problem (skipped, as the API's 422), never a freeze guarding nothing; the daemon key needs none."""
    out, problems = declared_freezes({"freeze": "true", "freezeTargets": "ranker ranker-typo"}, [], "ns/cm",
                                     known={"default/ranker"})
    assert [s for s, _, _ in out] == ["*", "default/ranker"]
    assert problems == ["freezeTargets: no policy names default/ranker-typo (known: default/ranker); skipped"]
    assert declared_freezes({"freezeTargets": "x"}, [], "ns/cm", known=set())[1] == \
        ["freezeTargets: no policy names default/x (known: none); skipped"]


# ---- the daemon following the ConfigMap ------------------------------------------------------------


@pytest.fixture
async def svc(tmp_path: Path, kube_emulator: KubeEmulator, sink: NotifySink) -> AsyncIterator[Service]:
    kube_emulator.seed({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": NS},
                        "data": {"freeze": "false", "freezeTargets": "", "freezeReason": ""}})
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "p.yaml").write_text(POLICY.replace("URL", sink.url))
    settings = local_settings(tmp_path, pol, kubernetes=kube_settings(write_kubeconfig(tmp_path / "kc", kube_emulator)),
                              control={"configMap": NAME, "namespace": NS, "pollIntervalSeconds": 0.05})
    async with Service(settings, action_registry(), detector_registry()) as s:
        yield s


def _active(svc: Service) -> list[str]:
    return sorted(f.target for f in svc.journal.freezes.active())


async def test_freeze_via_configmap_stops_the_action_and_clearing_it_lets_the_next_through(
        svc: Service, sink: NotifySink, kube_emulator: KubeEmulator) -> None:
    """`kubectl patch` sets freeze: the next signal is blocked, journaled with the manager as who and
    the reason given; the API cannot lift it (409, clear it there); clearing the key lifts it."""
    await kubectl_patch(kube_emulator, {"freeze": "true", "freezeReason": "node upgrades"}, "kubectl-patch")
    await wait_for(lambda: _active(svc) == ["*"])
    await alert(svc, 0)
    state, reason = await last_decision(svc)
    assert state == "blocked" and sink.received == []
    assert reason.startswith(f"daemon frozen: ConfigMap {NS}/{NAME} key freeze set by kubectl-patch: node upgrades")
    (freeze,) = svc.journal.freezes.active()
    assert (freeze.by, freeze.source) == ("kubectl-patch", "configmap")
    assert (await call(svc, "GET", "/readyz", None))[1]["frozen"] is True
    status, body = await call(svc, "POST", "/api/v1/unfreeze", OPERATOR, {"reason": "no"})
    assert status == 409 and "frozen by the control ConfigMap" in body["error"] and "clear it there" in body["error"]

    await kubectl_patch(kube_emulator, {"freeze": "false"}, "kubectl-edit")
    await wait_for(lambda: _active(svc) == [])
    (lifted,) = svc.journal.freezes.all("*")
    assert lifted.lifted_by == "kubectl-edit" and lifted.lifted_reason == f"cleared in ConfigMap {NS}/{NAME} by kubectl-edit"
    await alert(svc, 1)
    assert (await last_decision(svc))[0] == "succeeded" and len(sink.received) == 1


async def test_target_freeze_via_configmap_names_kubectl_from_its_user_agent(
        svc: Service, sink: NotifySink, kube_emulator: KubeEmulator) -> None:
    await kubectl_patch(kube_emulator, {"freezeTargets": "ranker"}, None)
    await wait_for(lambda: _active(svc) == ["default/ranker"])
    await alert(svc, 0)
    state, reason = await last_decision(svc)
    assert state == "blocked" and "target frozen: ConfigMap" in reason and "set by kubectl:" in reason
    status, doc = await call(svc, "GET", "/api/v1/status", OPERATOR)
    assert doc["targets"][0]["freeze"]["by"] == "kubectl"
    await kubectl_patch(kube_emulator, {"freezeTargets": ""}, None)
    await wait_for(lambda: _active(svc) == [])
    await alert(svc, 1)
    assert (await last_decision(svc))[0] == "succeeded" and len(sink.received) == 1


async def test_a_configmap_freeze_of_a_target_no_policy_names_stores_nothing(
        svc: Service, kube_emulator: KubeEmulator) -> None:
    await kubectl_patch(kube_emulator, {"freezeTargets": "ranker-typo, ranker"}, None)
    await wait_for(lambda: _active(svc) == ["default/ranker"])  # applied in the same pass as the typo
    assert svc.journal.freezes.all("default/ranker-typo") == []


# ---- leader and follower ---------------------------------------------------------------------------


async def test_follower_names_the_leader_and_a_freeze_survives_failover(
        tmp_path: Path, kube_emulator: KubeEmulator, sink: NotifySink) -> None:
    """Status and control calls reaching a follower get 503 naming the leader (the Lease holder); a
    freeze made on the leader travels in the shared cluster state and blocks on the next leader."""
    from tests.emulator.test_restart_election import _replica

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    a = await _replica(tmp_path, "a", kubeconfig, sink.url)
    b: Service | None = None
    try:
        await wait_for(a.may_act)
        b = await _replica(tmp_path, "b", kubeconfig, sink.url)
        status, body = await call(b, "GET", "/api/v1/status", OPERATOR)
        assert status == 503 and body["leader"] == "tailguard-a" and "tailguard-b is a follower" in body["error"]
        assert (await call(b, "POST", "/api/v1/freeze", OPERATOR, {"reason": "x"}))[0] == 503
        assert (await call(a, "POST", "/api/v1/freeze", OPERATOR, {"reason": "change freeze"}))[0] == 201
        await wait_for(lambda: "change freeze" in str(kube_emulator.get("configmaps", "tailguard", "tailguard-state")))
        await a.stop()
        await wait_for(b.may_act)
        await alert(b, 0)
        state, reason = await last_decision(b)
        assert state == "blocked" and reason.startswith("daemon frozen: change freeze (by alice via api)")
        assert sink.received == []
        assert (await call(b, "GET", "/api/v1/status", OPERATOR))[1]["freeze"]["daemon"]["reason"].startswith(
            "change freeze")
    finally:
        await a.stop()
        if b is not None:
            await b.stop()
