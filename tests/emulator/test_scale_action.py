"""kubernetes.scale end to end against the emulator with the real client: a Deployment scaled out,
verified and reverted; an HPA's floor raised where the HPA owns the count (the emulator's HPA rule
scales the Deployment); refusals on objects KEDA or a GitOps controller owns; every write through the
daemon's door (a frozen target gets none) with its resourceVersion precondition."""
from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient
from pydantic import ValidationError

from actions.base import ActionDeps, Preconditions, Step
from actions.registry import ACTIONS
from actions.scale import Scale, ScaleParams, plan_scale
from core.outcome import OutcomeStatus, PermanentError
from core.signal import Signal, SignalSource
from core.target import Target
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.workers.door import EXECUTOR, REVERT, acting
from daemon.workers.state import ExecutorState
from lab.kube.emulator import InvalidObject, KubeEmulator
from lab.kube.schemas import object_errors
from policies.loader import PolicySet
from tests.support.fake_triton import CountingDoor

NS, NAME = "serving", "ranker"
TARGET = Target(model="ranker", namespace=NS)
SIGNAL = Signal(SignalSource.ALERT, "RankerNearCapacity", {}, datetime.datetime.now(datetime.timezone.utc), "k")


def deployment(replicas: int = 2, **metadata: Any) -> dict[str, Any]:
    labels = {"app": NAME}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": NS, **metadata},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "triton", "image": "nvcr.io/nvidia/tritonserver"}]}}}}


def hpa(low: int = 2, high: int = 10, name: str = NAME, **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": NS, **metadata},
            "spec": {"minReplicas": low, "maxReplicas": high,
                     "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME}}}


def params(**kwargs: Any) -> ScaleParams:
    return ScaleParams.model_validate({"deployment": {"namespace": NS, "name": NAME}, "max": 8, **kwargs})


def replicas(emulator: KubeEmulator) -> int:
    found = emulator.get("deployments", NS, NAME)
    assert found is not None
    return int(found["spec"]["replicas"])


def min_replicas(emulator: KubeEmulator, name: str = NAME) -> int:
    found = emulator.get("horizontalpodautoscalers", NS, name)
    assert found is not None
    return int(found["spec"]["minReplicas"])


async def observe_and_plan(action: Scale, p: ScaleParams) -> Step:
    return action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)


@pytest.fixture
def action(kube_api: ApiClient) -> Scale:
    return Scale(ActionDeps(kube=kube_api))


# ---- params and the pure plan -------------------------------------------------------------------


def test_the_registry_names_the_action_and_it_offers_preconditions() -> None:
    assert ACTIONS["kubernetes.scale"] is Scale
    assert issubclass(Scale, Preconditions)


@pytest.mark.parametrize("bad", [{}, {"to": 3, "by": 1}, {"to": 9}, {"by": 0}, {"to": 3, "extra": 1}])
def test_params_need_one_of_to_and_by_within_max(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        params(**bad)


def test_plan_raises_replicas_capped_at_max_and_never_lowers() -> None:
    step = plan_scale(deployment(3), [], params(by=10))
    assert (step.before["field"], step.before["value"], step.after["value"]) == ("replicas", 3, 8)
    lower = plan_scale(deployment(5), [], params(to=4))
    assert lower.noop and lower.after["value"] == 5 and "already 5" in lower.summary


def test_plan_raises_the_hpa_floor_where_an_hpa_scales_the_deployment() -> None:
    step = plan_scale(deployment(2), [hpa(name="other") | {"spec": {**hpa()["spec"], "scaleTargetRef":
                                                                    {"apiVersion": "apps/v1", "kind": "Deployment",
                                                                     "name": "other"}}}, hpa(2, 6)],
                      params(to=8))
    assert step.before["object"] == {"kind": "HorizontalPodAutoscaler", "namespace": NS, "name": NAME}
    assert (step.before["field"], step.before["value"], step.after["value"]) == ("minReplicas", 2, 6)
    assert "capped at its maxReplicas 6" in step.summary


@pytest.mark.parametrize("owned, who", [
    ({"ownerReferences": [{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": NAME,
                           "uid": "u"}]}, "KEDA (ownerReference ScaledObject/ranker)"),
    ({"labels": {"scaledobject.keda.sh/name": NAME, "app.kubernetes.io/managed-by": "keda-operator"}}, "KEDA"),
])
def test_plan_refuses_an_hpa_keda_made(owned: dict[str, Any], who: str) -> None:
    with pytest.raises(PermanentError, match=re.escape(f"HorizontalPodAutoscaler serving/ranker is managed by {who}")):
        plan_scale(deployment(2), [hpa(**owned)], params(to=4))


@pytest.mark.parametrize("owned", [
    {"annotations": {"argocd.argoproj.io/tracking-id": "serving:apps/Deployment:serving/ranker"}},
    {"labels": {"kustomize.toolkit.fluxcd.io/name": "serving", "kustomize.toolkit.fluxcd.io/namespace": "flux"}},
    {"labels": {"helm.toolkit.fluxcd.io/name": "ranker"}},
])
def test_plan_refuses_a_deployment_gitops_owns_unless_allowed(owned: dict[str, Any]) -> None:
    with pytest.raises(PermanentError, match="managed by a GitOps controller"):
        plan_scale(deployment(2, **owned), [], params(to=4))
    assert plan_scale(deployment(2, **owned), [], params(to=4, allowOwnedBy=["gitops"])).after["value"] == 4
    assert plan_scale(deployment(5, **owned), [], params(to=4)).noop  # nothing to write: nothing refused


# ---- against the emulator with the real client ---------------------------------------------------


async def test_scale_out_verify_revert(action: Scale, kube_emulator: KubeEmulator) -> None:
    """by 2 on 2 replicas: one GET, one LIST, one PATCH to 4; verify OK; revert puts back exactly 2."""
    kube_emulator.seed(deployment(2))
    p = params(by=2)
    step = await observe_and_plan(action, p)
    outcome = await action.apply(step, TARGET, p)
    assert outcome.status is OutcomeStatus.OK, outcome.message
    assert replicas(kube_emulator) == 4
    assert [(r.verb, r.resource) for r in kube_emulator.requests] == [
        ("list", "horizontalpodautoscalers"), ("get", "deployments"), ("patch", "deployments")]
    assert (await action.verify(step, TARGET, p)).ok
    reverted = await action.revert(step, TARGET, p)
    assert reverted.ok, reverted.message
    assert replicas(kube_emulator) == 2
    written = [w.object for w in kube_emulator.writes if w.verb == "patch"]
    assert len(written) == 2 and all(object_errors(o) == [] for o in written)


async def test_hpa_floor_scales_the_deployment_and_revert_restores_the_floor(
        action: Scale, kube_emulator: KubeEmulator) -> None:
    """With an HPA the floor is raised (never spec.replicas); the HPA controller scales to it."""
    kube_emulator.seed(deployment(2))
    kube_emulator.seed(hpa(2, 10))
    p = params(to=5)
    step = await observe_and_plan(action, p)
    assert (await action.apply(step, TARGET, p)).ok
    assert min_replicas(kube_emulator) == 5 and replicas(kube_emulator) == 5
    assert {r.resource for r in kube_emulator.requests_for("patch")} == {"horizontalpodautoscalers"}
    verified = await action.verify(step, TARGET, p)
    assert verified.ok and verified.data["replicas"] == 5
    assert (await action.revert(step, TARGET, p)).ok
    assert min_replicas(kube_emulator) == 2 and replicas(kube_emulator) == 5  # the HPA scales in on metrics


async def test_a_keda_hpa_is_refused_right_before_the_write(action: Scale, kube_emulator: KubeEmulator) -> None:
    """KEDA taking the HPA over between plan and apply: the compare-and-swap's owner check refuses."""
    kube_emulator.seed(deployment(2))
    kube_emulator.seed(hpa(2, 10))
    p = params(to=5)
    step = await observe_and_plan(action, p)
    kube_emulator.modify("horizontalpodautoscalers", NS, NAME, lambda o: o["metadata"].update(
        labels={"scaledobject.keda.sh/name": NAME}))
    outcome = await action.apply(step, TARGET, p)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert "managed by KEDA" in outcome.message
    assert min_replicas(kube_emulator) == 2 and kube_emulator.writes == []


async def test_a_gitops_deployment_gets_no_write(action: Scale, kube_emulator: KubeEmulator) -> None:
    kube_emulator.seed(deployment(2, annotations={"argocd.argoproj.io/tracking-id": "x:apps/Deployment:serving/ranker"}))
    with pytest.raises(PermanentError, match="GitOps"):
        await observe_and_plan(action, params(to=4))
    assert kube_emulator.requests_for("patch") == [] and replicas(kube_emulator) == 2


async def test_someone_elses_scale_is_not_overwritten_nor_reverted(action: Scale, kube_emulator: KubeEmulator) -> None:
    kube_emulator.seed(deployment(2))
    p = params(to=4)
    step = await observe_and_plan(action, p)
    kube_emulator.modify("deployments", NS, NAME, lambda o: o["spec"].update(replicas=3))
    outcome = await action.apply(step, TARGET, p)
    assert not outcome.ok and "changed by someone else" in outcome.message and replicas(kube_emulator) == 3
    assert not (await action.preconditions(step, TARGET, p)).ok
    kube_emulator.modify("deployments", NS, NAME, lambda o: o["spec"].update(replicas=2))
    assert (await action.apply(step, TARGET, p)).ok
    kube_emulator.modify("deployments", NS, NAME, lambda o: o["spec"].update(replicas=6))
    reverted = await action.revert(step, TARGET, p)
    assert not reverted.ok and replicas(kube_emulator) == 6


async def test_reapplying_a_landed_step_is_a_noop_that_knows_its_stamp(
        action: Scale, kube_emulator: KubeEmulator) -> None:
    kube_emulator.seed(deployment(2))
    p = params(to=4)
    step = Step(**{**(await observe_and_plan(action, p)).__dict__, "effect_key": "7/0"})
    assert (await action.apply(step, TARGET, p)).ok
    again = await action.apply(step, TARGET, p)
    assert again.status is OutcomeStatus.NOOP and again.data["ours"] is True
    assert (await action.preconditions(step, TARGET, p)).ok
    assert [w.verb for w in kube_emulator.writes] == ["patch"]


# ---- through the daemon's door -------------------------------------------------------------------


class Rig:
    def __init__(self, tmp_path: Path, kube: ApiClient) -> None:
        self.journal = Journal(tmp_path / "journal.db")
        self.deps = ActionDeps(kube=kube)
        self.door = CountingDoor(self.journal, ExecutorState(PolicySet()), self.deps, lambda: True, Metrics())
        self.deps.actuator = self.door


@pytest.fixture
async def rig(tmp_path: Path, kube_api: ApiClient) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, kube_api)
    yield r
    r.journal.close()


async def test_every_write_passes_the_door_with_its_precondition(rig: Rig, kube_emulator: KubeEmulator) -> None:
    kube_emulator.seed(deployment(2))
    action, p = Scale(rig.deps), params(to=4)
    step = await observe_and_plan(action, p)
    with acting(EXECUTOR, TARGET.key, 1):
        assert (await action.apply(step, TARGET, p)).ok
    with acting(REVERT, TARGET.key, 1):
        assert (await action.revert(step, TARGET, p)).ok
    patches = kube_emulator.requests_for("patch")
    assert len(patches) == rig.door.sent == 2 and replicas(kube_emulator) == 2
    for patch in patches:
        assert patch.body[0]["op"] == "test" and patch.body[0]["path"] == "/metadata/resourceVersion"
    rows = rig.journal.effects.of(TARGET.key)
    assert [(r.writer, r.status) for r in rows] == [(EXECUTOR, "intent"), (EXECUTOR, "done"),
                                                          (REVERT, "intent"), (REVERT, "done")]


async def test_a_frozen_target_is_not_scaled(rig: Rig, kube_emulator: KubeEmulator) -> None:
    kube_emulator.seed(deployment(2))
    rig.journal.freezes.record(TARGET.key, "operator: hands off", float("inf"))
    action, p = Scale(rig.deps), params(to=4)
    step = await observe_and_plan(action, p)
    with acting(EXECUTOR, TARGET.key, 1):
        outcome = await action.apply(step, TARGET, p)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert "refused by the door (freeze)" in outcome.message
    assert kube_emulator.requests_for("patch") == [] and replicas(kube_emulator) == 2
    (row,) = rig.journal.effects.of(TARGET.key)
    assert row.status == "refused" and row.data["check"] == "freeze"


# ---- the emulator's Deployments and HPAs (lab/kube/workloads.py) ---------------------------------


def test_the_emulator_defaults_replicas_and_keeps_an_hpa_within_its_bounds(kube_emulator: KubeEmulator) -> None:
    plain = deployment()
    del plain["spec"]["replicas"]
    assert kube_emulator.seed(plain)["spec"]["replicas"] == 1  # the API server's default
    kube_emulator.seed(hpa(3, 4))
    assert replicas(kube_emulator) == 3  # raised to the floor by the HPA controller
    kube_emulator.modify("deployments", NS, NAME, lambda o: o["spec"].update(replicas=9))
    assert replicas(kube_emulator) == 4  # held at the ceiling
    stored = kube_emulator.get("deployments", NS, NAME)
    assert stored is not None
    managers = [e["manager"] for e in stored["metadata"]["managedFields"]]
    assert "kube-controller-manager" in managers


@pytest.mark.parametrize("spec, field", [({"minReplicas": 5, "maxReplicas": 4}, "spec.maxReplicas"),
                                         ({"minReplicas": 0, "maxReplicas": 4}, "spec.minReplicas")])
def test_the_emulator_refuses_an_hpa_the_api_server_refuses(kube_emulator: KubeEmulator, spec: dict[str, int],
                                                            field: str) -> None:
    bad = hpa()
    bad["spec"].update(spec)
    with pytest.raises(InvalidObject, match=field):
        kube_emulator.seed(bad)
