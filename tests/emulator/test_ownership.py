"""Objects someone else owns (actions/_ownership.py): the pure decision, the `allowOwnedBy` params,
and every Kubernetes writer refusing them at plan (so `tailguard simulate` shows it) and right
before the write; a change of ours reverted by someone else is reported at verify, not fought."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pytest
from kubernetes_asyncio.client import ApiClient
from pydantic import ValidationError

from actions._ownership import (changed_by_note, foreign_owner, last_writer, ownership_of, refusal, refuse_owned)
from actions.base import ActionDeps, Step
from actions.gateway import RetuneTimeout, RetuneTimeoutParams
from actions.istio import ShiftWeights, ShiftWeightsParams
from core.outcome import OutcomeStatus, PermanentError
from core.query import QueryResult, Sample
from core.target import Target
from daemon.common.config import load_settings
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.simulate import simulate
from lab.kube.emulator import KubeEmulator
from tests.support.kube_helpers import http_route, virtual_service, write_kubeconfig
from tests.support.paths import SAMPLES

NS = "serving"
TARGET = Target("ranker", NS)
SIGNAL: Any = None  # plan does not read the signal
CANARY = {"apiVersion": "flagger.app/v1beta1", "kind": "Canary", "name": "ranker", "uid": "c-1",
          "controller": True}
ROLLOUT = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "ranker", "uid": "r-1"}
FLAGGER_REFUSAL = ("refused: VirtualService serving/ranker is managed by Flagger (ownerReference Canary/ranker); "
                   "set allowOwnedBy to override")


def managed(manager: str, time: str = "2024-05-01T10:00:00Z", operation: str = "Update",
            **extra: Any) -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "apiVersion": "v1", "time": time,
            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}, **extra}


def meta(refs: list[dict[str, Any]] | None = None, managers: list[dict[str, Any]] | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": "ranker", "namespace": NS}
    if refs:
        out["ownerReferences"] = refs
    if managers:
        out["managedFields"] = managers
    if labels:
        out["labels"] = labels
    return out


def owned(obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """`obj` with metadata as `meta(**kw)` gives (ownerReferences, managedFields, labels)."""
    obj["metadata"].update({k: v for k, v in meta(**kw).items() if k not in ("name", "namespace")})
    return obj


# ---- pure: who owns an object ------------------------------------------------------------------


def test_flagger_canary_owner_reference_is_refused_with_the_owner_named() -> None:
    """An ownerReference to a Flagger Canary refuses the write and names it."""
    assert refusal("VirtualService serving/ranker", meta([CANARY])) == FLAGGER_REFUSAL
    with pytest.raises(PermanentError) as caught:
        refuse_owned("VirtualService serving/ranker", meta([CANARY]))
    assert str(caught.value) == FLAGGER_REFUSAL and not caught.value.retryable


@pytest.mark.parametrize("ref,owner", [
    (ROLLOUT, "Argo Rollouts (ownerReference Rollout/ranker)"),
    ({**CANARY, "apiVersion": "flagger.app/v1alpha3"}, "Flagger (ownerReference Canary/ranker)"),
    ({**CANARY, "apiVersion": "example.com/v1"}, None),  # another project's Canary kind
    ({**ROLLOUT, "apiVersion": "apps.example.com/v1"}, None),
    ({"apiVersion": "apps/v1", "kind": "Deployment", "name": "ranker", "uid": "d"}, None),
])
def test_owner_references_count_only_for_their_api_group(ref: dict[str, Any], owner: str | None) -> None:
    """Canary of flagger.app/*, Rollout of argoproj.io/*; the same kind from another group is no owner."""
    found = foreign_owner(meta([ref]))
    assert (str(found) if found else None) == owner


@pytest.mark.parametrize("manager,key", [
    ("flagger", "flagger"), ("flagger-controller", "flagger"),
    ("rollouts-controller", "argo-rollouts"), ("argo-rollouts", "argo-rollouts"),
    ("argocd-controller", "gitops"), ("argocd-application-controller", "gitops"),
    ("kustomize-controller", "gitops"), ("helm-controller", "gitops"),
    ("kubectl-edit", None), ("helm", None), ("tailguard", None),
])
def test_managers_in_managed_fields_name_the_owner(manager: str, key: str | None) -> None:
    """Managers starting with "flagger", the Argo Rollouts and GitOps controllers; others are no owner."""
    found = foreign_owner(meta(managers=[managed("kubectl-client-side-apply"), managed(manager)]))
    assert (found.key if found else None) == key
    if found:
        assert found.evidence == f"manager {manager}"


def test_helm_alone_is_not_an_owner_but_gitops_on_top_is() -> None:
    """managed-by: Helm (and the helm manager) is fine to edit; a GitOps controller on top is not."""
    helm = {"app.kubernetes.io/managed-by": "Helm"}
    assert foreign_owner(meta(labels=helm, managers=[managed("helm")])) is None
    why = refusal("ConfigMap serving/gw", meta(labels=helm, managers=[managed("helm"), managed("helm-controller")]))
    assert why == ("refused: ConfigMap serving/gw is managed by a GitOps controller (manager helm-controller); "
                   "set allowOwnedBy to override")


def test_a_manager_of_the_status_subresource_only_is_not_an_owner() -> None:
    """An entry for the status subresource manages status, not the spec or data we write."""
    assert foreign_owner(meta(managers=[managed("flagger", subresource="status")])) is None


def test_allow_owned_by_accepts_named_owners_only() -> None:
    """allowOwnedBy skips the owners it names; any other owner still refuses."""
    both = meta([CANARY], [managed("argocd-controller", operation="Apply")])
    assert foreign_owner(meta([CANARY]), ["flagger"]) is None
    assert str(foreign_owner(both, ["flagger"])) == "a GitOps controller (manager argocd-controller)"
    assert foreign_owner(both, ["flagger", "gitops"]) is None
    assert refusal("x", None) is None and foreign_owner({}) is None


def test_ownership_of_keeps_what_the_decision_reads() -> None:
    """The journaled copy decides like the metadata itself, without fieldsV1 or uids."""
    full = meta([CANARY], [managed("kustomize-controller"), managed("flagger", subresource="status")])
    slim = ownership_of(full)
    assert "fieldsV1" not in str(slim) and "uid" not in str(slim)
    assert foreign_owner(slim) == foreign_owner(full) and last_writer(slim) == last_writer(full)
    assert ownership_of({"name": "x"}) == {"ownerReferences": [], "managedFields": []}


def test_last_writer_is_the_most_recent_entry_not_counting_status() -> None:
    """The entry with the latest time (any time zone form) names who changed the object last."""
    entries = [managed("tailguard", "2024-05-01T10:00:00Z"),
               managed("argocd-application-controller", "2024-05-01T10:00:05+00:00"),
               managed("kubectl-edit", "2024-05-01T09:00:00Z"),
               managed("istio-status", "2024-05-01T11:00:00Z", subresource="status"),
               {"manager": "no-time", "operation": "Update"}]
    assert last_writer(meta(managers=entries)) == {
        "manager": "argocd-application-controller", "operation": "Update", "time": "2024-05-01T10:00:05+00:00"}
    assert changed_by_note(meta(managers=entries)) == (
        "; last changed by argocd-application-controller (Update at 2024-05-01T10:00:05+00:00)")
    assert last_writer(meta()) is None and changed_by_note(None) == ""


# ---- params: allowOwnedBy, strictly ------------------------------------------------------------


def shift_params(**kw: Any) -> ShiftWeightsParams:
    return ShiftWeightsParams.model_validate({"virtualService": {"namespace": NS, "name": "ranker"},
                                             "set": {"v2": 0}, **kw})


def retune_params(sink: dict[str, Any], **kw: Any) -> RetuneTimeoutParams:
    return RetuneTimeoutParams.model_validate({"query": "p999", "maxMs": 60000, "sink": sink, **kw})


ISTIO_SINK = {"kind": "istio", "namespace": NS, "name": "ranker"}
HTTPROUTE_SINK = {"kind": "httproute", "namespace": NS, "name": "ranker"}
CONFIGMAP_SINK = {"kind": "configmap", "namespace": NS, "name": "gw", "key": "t"}


def test_allow_owned_by_params_default_empty_and_are_strict() -> None:
    """Default none; known names only, each once, as a list; the HTTP sink (no object) has no such key."""
    assert shift_params().allow_owned_by == ()
    assert shift_params(allowOwnedBy=["flagger", "argo-rollouts", "gitops"]).allow_owned_by == (
        "flagger", "argo-rollouts", "gitops")
    for sink in (ISTIO_SINK, HTTPROUTE_SINK, CONFIGMAP_SINK):
        assert retune_params({**sink, "allowOwnedBy": ["gitops"]}).sink.allow_owned_by == ("gitops",)
    for bad in (["argo"], ["flagger", "flagger"], "flagger", [None], {"flagger": True}):
        with pytest.raises(ValidationError, match="allowOwnedBy"):
            shift_params(allowOwnedBy=bad)
        with pytest.raises(ValidationError, match="allowOwnedBy"):
            retune_params({**ISTIO_SINK, "allowOwnedBy": bad})
    with pytest.raises(ValidationError):
        retune_params({"kind": "http", "url": "http://gw/t", "allowOwnedBy": ["gitops"]})
    with pytest.raises(ValidationError):
        retune_params(ISTIO_SINK, allowOwnedBy=["gitops"])  # on the sink, not the action


# ---- istio.shift_weights against the emulator ---------------------------------------------------


def weighted(**kw: Any) -> dict[str, Any]:
    vs = virtual_service()
    vs["spec"]["http"][0]["route"] = [{"destination": {"host": "ranker", "subset": s}, "weight": w}
                                      for s, w in (("v1", 90), ("v2", 10))]
    return owned(vs, **kw)


def weights(emulator: KubeEmulator) -> list[int]:
    return [d["weight"] for d in emulator.get("virtualservices", NS, "ranker")["spec"]["http"][0]["route"]]


async def test_shift_weights_refuses_a_flagger_canary_at_plan(kube_api: ApiClient,
                                                              kube_emulator: KubeEmulator) -> None:
    """A VirtualService owned by a Canary: plan raises the refusal; nothing is written."""
    kube_emulator.seed(weighted(refs=[CANARY]))
    action, p = ShiftWeights(ActionDeps(kube=kube_api)), shift_params()
    with pytest.raises(PermanentError) as caught:
        action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    assert str(caught.value) == FLAGGER_REFUSAL and not caught.value.retryable
    assert kube_emulator.writes == [] and weights(kube_emulator) == [90, 10]


async def test_shift_weights_writes_an_owned_object_when_allowed(kube_api: ApiClient,
                                                                 kube_emulator: KubeEmulator) -> None:
    """allowOwnedBy [flagger] writes the Canary's VirtualService; the write names tailguard as manager."""
    kube_emulator.seed(weighted(refs=[CANARY], managers=[managed("flagger")]))
    action, p = ShiftWeights(ActionDeps(kube=kube_api)), shift_params(allowOwnedBy=["flagger"])
    step = action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    assert (await action.apply(step, TARGET, p)).ok and weights(kube_emulator) == [100, 0]
    assert kube_emulator.requests_for("patch")[0].query.get("fieldManager") == "tailguard"


async def test_a_noop_on_an_owned_object_is_not_refused(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """Nothing to write, nothing to refuse: weights already as wanted plan a noop."""
    vs = weighted(managers=[managed("argocd-controller", operation="Apply")])
    vs["spec"]["http"][0]["route"][0]["weight"], vs["spec"]["http"][0]["route"][1]["weight"] = 100, 0
    kube_emulator.seed(vs)
    action, p = ShiftWeights(ActionDeps(kube=kube_api)), shift_params()
    assert action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL).noop


async def test_an_owner_arriving_after_plan_is_refused_right_before_the_write(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """Argo Rollouts takes the object between plan and apply: the guarded PATCH fails (version),
    the re-read shows the owner, and apply refuses, not retryable, without a second PATCH."""
    kube_emulator.seed(weighted())
    action, p = ShiftWeights(ActionDeps(kube=kube_api)), shift_params()
    step = action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    kube_emulator.modify("virtualservices", NS, "ranker", lambda o: owned(o, refs=[ROLLOUT]))
    outcome = await action.apply(step, TARGET, p)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert outcome.message == ("apply: refused: VirtualService serving/ranker is managed by Argo Rollouts "
                               "(ownerReference Rollout/ranker); set allowOwnedBy to override")
    assert [r.status for r in kube_emulator.requests_for("patch")] == [422] and weights(kube_emulator) == [90, 10]


async def test_revert_of_an_object_taken_over_since_is_refused(kube_api: ApiClient,
                                                               kube_emulator: KubeEmulator) -> None:
    """A GitOps controller that started managing the object after our write: revert leaves it alone."""
    kube_emulator.seed(weighted())
    action, p = ShiftWeights(ActionDeps(kube=kube_api)), shift_params()
    step = action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    assert (await action.apply(step, TARGET, p)).ok
    kube_emulator.modify("virtualservices", NS, "ranker", lambda o: owned(o, managers=[managed("kustomize-controller")]))
    outcome = await action.revert(step, TARGET, p)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert "revert: refused: VirtualService serving/ranker is managed by a GitOps controller" in outcome.message
    assert weights(kube_emulator) == [100, 0] and len(kube_emulator.requests_for("patch")) == 1


async def test_verify_reports_who_reverted_our_weights_and_does_not_fight(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """Argo CD put the weights back after our write: verify names it (latest managedFields entry),
    not retryable; without managedFields verify says only what differs."""
    kube_emulator.seed(weighted())
    action, p = ShiftWeights(ActionDeps(kube=kube_api)), shift_params()
    step = action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    assert (await action.apply(step, TARGET, p)).ok

    def argocd_sync(o: dict[str, Any]) -> None:
        o["spec"]["http"][0]["route"][0]["weight"], o["spec"]["http"][0]["route"][1]["weight"] = 90, 10
        owned(o, managers=[managed("tailguard", "2024-05-01T10:00:00Z"),
                           managed("argocd-application-controller", "2024-05-01T10:00:30Z")])

    kube_emulator.modify("virtualservices", NS, "ranker", argocd_sync)
    outcome = await action.verify(step, TARGET, p)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert outcome.message.endswith("; last changed by argocd-application-controller (Update at 2024-05-01T10:00:30Z)")
    assert outcome.data["changedBy"]["manager"] == "argocd-application-controller"
    kube_emulator.modify("virtualservices", NS, "ranker", lambda o: o["metadata"].pop("managedFields"))
    quiet = await action.verify(step, TARGET, p)
    assert not quiet.retryable and "last changed by" not in quiet.message and quiet.data["changedBy"] is None
    assert len(kube_emulator.requests_for("patch")) == 1  # reported, never written back


async def test_applying_again_after_our_write_was_changed_back_does_not_fight(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """A retried or resumed apply that finds its own stamp but the old weights again (someone put them
    back after our write landed) refuses instead of writing them a second time; revert has nothing to do."""
    kube_emulator.seed(weighted())
    action, p = ShiftWeights(ActionDeps(kube=kube_api)), shift_params()
    step = replace(action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL), effect_key="7/0")
    assert (await action.apply(step, TARGET, p)).ok
    kube_emulator.modify("virtualservices", NS, "ranker", lambda o: [
        r.update(weight=w) for r, w in zip(o["spec"]["http"][0]["route"], (90, 10))])
    again = await action.apply(step, TARGET, p)
    assert again.status is OutcomeStatus.FAILED and not again.retryable
    assert "again after this step's own write had landed" in again.message and "changed back" in again.message
    assert (await action.revert(step, TARGET, p)).status is OutcomeStatus.NOOP
    assert weights(kube_emulator) == [90, 10]
    # The second apply's first PATCH trusts the plan's reading and fails its resourceVersion test.
    assert [r.status for r in kube_emulator.requests_for("patch")] == [200, 422]


async def test_simulate_shows_the_refusal(tmp_path: Path, kube_emulator: KubeEmulator) -> None:
    """`tailguard simulate` on a Flagger-owned VirtualService: the plan is blocked with the refusal."""
    kube_emulator.seed(weighted(refs=[CANARY]))
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(
        "name: ranker-weights\ntarget: {model: ranker, namespace: serving, triton: {endpoints: ['http://127.0.0.1:9']}}\n"
        "triggers: [{alert: {name: TritonTailLatencyHigh, actsUngoverned: true}}]\n"
        "actions: [{type: istio.shift_weights, virtualService: {namespace: serving, name: ranker}, set: {v2: 0}}]\n"
        "verify: {query: 'vector(0)', below: 1, onNotRecovered: none}\n")  # required: alert-only
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    (tmp_path / "config.yaml").write_text(
        f"policies: {{path: policies}}\njournal: {{path: journal.db}}\n"
        f"kubernetes: {{mode: kubeconfig, kubeconfig: {kubeconfig}}}\nleaderElection: {{enabled: false}}\n")
    (result,) = await simulate(load_settings(tmp_path / "config.yaml"), SAMPLES / "alertmanager_webhook_v4.json",
                               action_registry(), detector_registry())
    (plan,) = result["plans"]
    assert plan["blocked"] == f"planning failed: {FLAGGER_REFUSAL}"
    assert kube_emulator.writes == []


# ---- gateway.retune_timeout's Kubernetes sinks against the emulator -------------------------------


def answer(value: float) -> Callable[[str], Any]:
    async def query(q: str) -> QueryResult:
        return QueryResult(q, (Sample({}, value),))
    return query


def configmap(**kw: Any) -> dict[str, Any]:
    return owned({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gw", "namespace": NS},
                  "data": {"t": "2000"}}, **kw)


@dataclass(frozen=True)
class SinkCase:
    """A Kubernetes sink: its object (owned as `seed`'s keywords say), in words, where it is stored,
    and the path to the timeout in it."""

    seed: Callable[..., dict[str, Any]]
    obj: str
    resource: str
    name: str
    path: tuple[str | int, ...]
    params: dict[str, Any]

    def timeout(self, emulator: KubeEmulator) -> Any:
        value: Any = emulator.get(self.resource, NS, self.name)
        for key in self.path:
            value = value[key]
        return value

    def set_timeout(self, obj: dict[str, Any], raw: Any) -> None:
        parent: Any = obj
        for key in self.path[:-1]:
            parent = parent[key]
        parent[self.path[-1]] = raw

    async def plan(self, kube: ApiClient, emulator: KubeEmulator, seed: dict[str, Any] | None = None,
                   **sink: Any) -> tuple[RetuneTimeout, RetuneTimeoutParams, Step]:
        """Seed the object, then observe and plan a retune of it (2 s -> 6 s)."""
        emulator.seed(self.seed(**(seed or {})))
        action, p = RetuneTimeout(ActionDeps(kube=kube, query=answer(4.0))), retune_params({**self.params, **sink})
        return action, p, action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)


SINKS = {
    "istio": SinkCase(lambda **kw: owned(virtual_service(timeout="2s"), **kw), "VirtualService serving/ranker",
                      "virtualservices", "ranker", ("spec", "http", 0, "timeout"), ISTIO_SINK),
    "httproute": SinkCase(lambda **kw: owned(http_route(timeouts={"request": "2s"}), **kw),
                          "HTTPRoute serving/ranker", "httproutes", "ranker",
                          ("spec", "rules", 0, "timeouts", "request"), HTTPROUTE_SINK),
    "configmap": SinkCase(configmap, "ConfigMap serving/gw", "configmaps", "gw", ("data", "t"), CONFIGMAP_SINK),
}


@pytest.mark.parametrize("sink", list(SINKS))
async def test_retune_refuses_a_gitops_managed_sink_object_at_plan(
        kube_api: ApiClient, kube_emulator: KubeEmulator, sink: str) -> None:
    """Every Kubernetes sink: an object kustomize-controller manages (a Helm label on top changes
    nothing) is refused at plan, naming the object and the manager."""
    case = SINKS[sink]
    with pytest.raises(PermanentError) as caught:
        await case.plan(kube_api, kube_emulator, {"managers": [managed("kustomize-controller")],
                                                  "labels": {"app.kubernetes.io/managed-by": "Helm"}})
    assert str(caught.value) == (f"refused: {case.obj} is managed by a GitOps controller (manager "
                                 "kustomize-controller); set allowOwnedBy to override")
    assert kube_emulator.writes == []


@pytest.mark.parametrize("sink", list(SINKS))
async def test_retune_writes_a_helm_installed_or_allowed_object(
        kube_api: ApiClient, kube_emulator: KubeEmulator, sink: str) -> None:
    """Helm alone is fine to edit; gitops in the sink's allowOwnedBy writes a GitOps-managed object."""
    case = SINKS[sink]
    action, p, step = await case.plan(
        kube_api, kube_emulator, {"managers": [managed("helm"), managed("argocd-controller", operation="Apply")]},
        allowOwnedBy=["gitops"])
    assert (await action.apply(step, TARGET, p)).ok and case.timeout(kube_emulator) == step.after["raw"]
    assert kube_emulator.requests_for("patch")[0].query.get("fieldManager") == "tailguard"


@pytest.mark.parametrize("sink", list(SINKS))
async def test_retune_refuses_an_owner_arriving_after_plan(
        kube_api: ApiClient, kube_emulator: KubeEmulator, sink: str) -> None:
    """Flagger takes the object between plan and apply: refused at the write, value untouched."""
    case = SINKS[sink]
    action, p, step = await case.plan(kube_api, kube_emulator)
    kube_emulator.modify(case.resource, NS, case.name, lambda o: owned(o, refs=[CANARY]))
    outcome = await action.apply(step, TARGET, p)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert outcome.message == (f"apply: refused: {case.obj} is managed by Flagger (ownerReference "
                               "Canary/ranker); set allowOwnedBy to override")
    assert case.timeout(kube_emulator) == step.before["timeout"]["raw"]


@pytest.mark.parametrize("sink", list(SINKS))
async def test_retune_verify_reports_who_reverted_the_timeout(
        kube_api: ApiClient, kube_emulator: KubeEmulator, sink: str) -> None:
    """helm-controller put the old timeout back after our write: verify names it, not retryable."""
    case = SINKS[sink]
    action, p, step = await case.plan(kube_api, kube_emulator)
    assert (await action.apply(step, TARGET, p)).ok

    def flux_sync(o: dict[str, Any]) -> None:
        case.set_timeout(o, step.before["timeout"]["raw"])
        owned(o, managers=[managed("tailguard", "2024-05-01T10:00:00Z"),
                           managed("helm-controller", "2024-05-01T10:01:00Z")])

    kube_emulator.modify(case.resource, NS, case.name, flux_sync)
    outcome = await action.verify(step, TARGET, p)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert "; last changed by helm-controller (Update at 2024-05-01T10:01:00" in outcome.message
    assert outcome.data["changedBy"]["manager"] == "helm-controller"
    assert len(kube_emulator.requests_for("patch")) == 1
