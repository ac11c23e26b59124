"""docs/extending.md's Kubernetes example runs: its `Swap` over a Deployment's replicas writes through
the real client to the emulator, guarded by resourceVersion, and refuses someone else's value and an
object a GitOps controller owns; with an effect key, its own landed write is a noop."""
from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient

from actions._kube import CustomObject
from core.outcome import OutcomeStatus
from lab.kube.emulator import KubeEmulator
from tests.emulator.test_scale_action import NAME, NS, deployment, replicas
from tests.unit.test_extending_doc import _run


def _deployment(api: ApiClient) -> CustomObject:
    return CustomObject(api, "docs example", group="apps", version="v1", plural="deployments", namespace=NS, name=NAME)


async def test_the_doc_example_scales_through_a_guarded_patch(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    ex: Any = _run(2)
    kube_emulator.seed(deployment(2))
    outcome = await ex.scale(_deployment(kube_api), 2, 3, effect_key="9/0")
    assert outcome.ok, outcome.message
    assert replicas(kube_emulator) == 3
    (patch,) = kube_emulator.requests_for("patch")
    assert patch.body[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": patch.body[0]["value"]}
    again = await ex.scale(_deployment(kube_api), 2, 3, effect_key="9/0")
    assert again.status is OutcomeStatus.NOOP and again.data["ours"] is True


async def test_the_doc_example_refuses_someone_elses_value_and_an_owned_object(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    ex: Any = _run(2)
    kube_emulator.seed(deployment(4))
    changed = await ex.scale(_deployment(kube_api), 2, 3)
    assert changed.status is OutcomeStatus.FAILED and "changed by someone else" in changed.message
    kube_emulator.modify("deployments", NS, NAME, lambda o: o["metadata"].update(
        labels={"kustomize.toolkit.fluxcd.io/name": "apps"}))
    owned = await ex.scale(_deployment(kube_api), 4, 6)
    assert owned.status is OutcomeStatus.FAILED and "GitOps" in owned.message
    assert replicas(kube_emulator) == 4 and kube_emulator.requests_for("patch") == []
