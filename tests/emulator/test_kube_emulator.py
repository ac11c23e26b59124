"""The Kubernetes API emulator keeps real API-server semantics, proven through the real kubernetes_asyncio client."""
from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes_asyncio.client import (ApiClient, CoordinationV1Api, CoreV1Api, CustomObjectsApi,
                                       DiscoveryV1Api)
from kubernetes_asyncio.client.exceptions import ApiException

from lab.kube.emulator import InvalidObject, KubeEmulator
from lab.kube.schemas import object_errors

ISTIO = ("networking.istio.io", "v1")
NS = "serving"


def virtual_service(name: str = "reviews", weights: tuple[int, int] = (90, 10)) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"hosts": [name], "http": [{"name": "primary", "route": [
            {"destination": {"host": name, "subset": "v1"}, "weight": weights[0]},
            {"destination": {"host": name, "subset": "v2"}, "weight": weights[1]},
        ]}]},
    }


def status_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


async def create_vs(api: ApiClient, body: dict[str, Any] | None = None, version: str = "v1") -> dict[str, Any]:
    return await CustomObjectsApi(api).create_namespaced_custom_object(
        ISTIO[0], version, NS, "virtualservices", body or virtual_service())


async def patch_vs(api: ApiClient, body: Any, *, name: str = "reviews", content_type: str | None = None,
                   version: str = "v1") -> dict[str, Any]:
    kwargs = {"_content_type": content_type} if content_type else {}
    return await CustomObjectsApi(api).patch_namespaced_custom_object(
        ISTIO[0], version, NS, "virtualservices", name, body, **kwargs)


# ---- create / read ---------------------------------------------------------------------------


async def test_create_sets_server_fields(kube_api: ApiClient) -> None:
    """Create assigns uid, resourceVersion, creationTimestamp and, for a CR, generation 1."""
    created = await create_vs(kube_api)
    meta = created["metadata"]
    assert meta["uid"] and meta["resourceVersion"].isdigit() and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1 and meta["namespace"] == NS


async def test_resource_version_is_cluster_wide_and_increasing(kube_api: ApiClient) -> None:
    """Writes to different objects and kinds share one increasing resourceVersion counter."""
    first = await create_vs(kube_api)
    cm = await CoreV1Api(kube_api).create_namespaced_config_map(NS, {"metadata": {"name": "c"}})
    second = await create_vs(kube_api, virtual_service("ratings"))
    versions = [int(first["metadata"]["resourceVersion"]), int(cm.metadata.resource_version),
                int(second["metadata"]["resourceVersion"])]
    assert versions == sorted(versions) and len(set(versions)) == 3


async def test_get_missing_is_404_not_found_status(kube_api: ApiClient) -> None:
    """GET of an absent object answers 404 with a Status whose reason is NotFound."""
    with pytest.raises(ApiException) as caught:
        await CustomObjectsApi(kube_api).get_namespaced_custom_object(*ISTIO, NS, "virtualservices", "nope")
    status = status_of(caught.value)
    assert caught.value.status == 404 and status["kind"] == "Status" and status["reason"] == "NotFound"
    assert status["message"] == 'virtualservices.networking.istio.io "nope" not found'


async def test_create_existing_is_409_already_exists(kube_api: ApiClient) -> None:
    """Creating a name that exists answers 409 AlreadyExists."""
    await create_vs(kube_api)
    with pytest.raises(ApiException) as caught:
        await create_vs(kube_api)
    assert caught.value.status == 409 and status_of(caught.value)["reason"] == "AlreadyExists"


async def test_istio_versions_share_one_object(kube_api: ApiClient) -> None:
    """An object created as v1 reads back as v1beta1 (same storage, relabelled apiVersion)."""
    await create_vs(kube_api)
    got = await CustomObjectsApi(kube_api).get_namespaced_custom_object(
        ISTIO[0], "v1beta1", NS, "virtualservices", "reviews")
    assert got["apiVersion"] == "networking.istio.io/v1beta1"
    assert got["spec"]["http"][0]["route"][1]["weight"] == 10


async def test_unknown_resource_is_404(kube_api: ApiClient) -> None:
    """A resource the emulator does not serve answers 404, as an uninstalled CRD would."""
    with pytest.raises(ApiException) as caught:
        await CustomObjectsApi(kube_api).list_namespaced_custom_object("example.com", "v1", NS, "widgets")
    assert caught.value.status == 404


# ---- optimistic concurrency --------------------------------------------------------------------


async def test_replace_with_stale_resource_version_is_409_conflict(kube_api: ApiClient,
                                                                   kube_emulator: KubeEmulator) -> None:
    """PUT carrying an old resourceVersion answers 409 Conflict and leaves the object as it was."""
    created = await create_vs(kube_api)
    kube_emulator.modify("virtualservices", NS, "reviews",
                         lambda o: o["spec"]["http"][0]["route"][0].update(weight=80) or
                         o["spec"]["http"][0]["route"][1].update(weight=20))
    stale = created | {"spec": virtual_service(weights=(0, 100))["spec"]}
    with pytest.raises(ApiException) as caught:
        await CustomObjectsApi(kube_api).replace_namespaced_custom_object(
            *ISTIO, NS, "virtualservices", "reviews", stale)
    status = status_of(caught.value)
    assert caught.value.status == 409 and status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]
    assert kube_emulator.get("virtualservices", NS, "reviews")["spec"]["http"][0]["route"][1]["weight"] == 20


async def test_replace_with_current_resource_version_succeeds(kube_api: ApiClient) -> None:
    """PUT with the current resourceVersion stores the object and bumps resourceVersion."""
    created = await create_vs(kube_api)
    body = created | {"spec": virtual_service(weights=(0, 100))["spec"]}
    replaced = await CustomObjectsApi(kube_api).replace_namespaced_custom_object(
        *ISTIO, NS, "virtualservices", "reviews", body)
    assert int(replaced["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert replaced["metadata"]["generation"] == 2


async def test_replace_custom_object_without_resource_version_is_422(kube_api: ApiClient) -> None:
    """Custom resources refuse unconditional updates: PUT without resourceVersion is 422 Invalid."""
    await create_vs(kube_api)
    with pytest.raises(ApiException) as caught:
        await CustomObjectsApi(kube_api).replace_namespaced_custom_object(
            *ISTIO, NS, "virtualservices", "reviews", virtual_service())
    assert caught.value.status == 422 and "metadata.resourceVersion" in status_of(caught.value)["message"]


async def test_json_patch_failed_test_op_is_422_and_writes_nothing(kube_api: ApiClient,
                                                                   kube_emulator: KubeEmulator) -> None:
    """A failed JSON-patch `test` op answers the API server's generic 422 Invalid; nothing is stored."""
    created = await create_vs(kube_api)
    await patch_vs(kube_api, {"metadata": {"labels": {"touched": "yes"}}},
                   content_type="application/merge-patch+json")
    with pytest.raises(ApiException) as caught:
        await patch_vs(kube_api, [
            {"op": "test", "path": "/metadata/resourceVersion", "value": created["metadata"]["resourceVersion"]},
            {"op": "replace", "path": "/spec/http/0/route/1/weight", "value": 0},
        ])
    status = status_of(caught.value)
    assert caught.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"] == "the server rejected our request due to an error in our request"
    assert kube_emulator.get("virtualservices", NS, "reviews")["spec"]["http"][0]["route"][1]["weight"] == 10


async def test_json_patch_passing_test_op_applies(kube_api: ApiClient) -> None:
    """A JSON patch whose `test` ops hold applies its other ops."""
    created = await create_vs(kube_api)
    patched = await patch_vs(kube_api, [
        {"op": "test", "path": "/metadata/resourceVersion", "value": created["metadata"]["resourceVersion"]},
        {"op": "test", "path": "/spec/http/0/route/1/weight", "value": 10},
        {"op": "replace", "path": "/spec/http/0/route/0/weight", "value": 100},
        {"op": "replace", "path": "/spec/http/0/route/1/weight", "value": 0},
    ])
    assert [r["weight"] for r in patched["spec"]["http"][0]["route"]] == [100, 0]


async def test_merge_patch_with_stale_resource_version_is_409(kube_api: ApiClient) -> None:
    """A resourceVersion inside a patch is a precondition: stale means 409 Conflict."""
    await create_vs(kube_api)
    with pytest.raises(ApiException) as caught:
        await patch_vs(kube_api, {"metadata": {"resourceVersion": "1"}, "spec": {"hosts": ["x"]}},
                       content_type="application/merge-patch+json")
    assert caught.value.status == 409


async def test_noop_patch_keeps_resource_version(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """A write that changes nothing does not bump resourceVersion and is not recorded as a write."""
    created = await create_vs(kube_api)
    patched = await patch_vs(kube_api, {"spec": {"hosts": ["reviews"]}},
                             content_type="application/merge-patch+json")
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert [w.verb for w in kube_emulator.writes] == ["create"]


async def test_metadata_only_patch_keeps_generation(kube_api: ApiClient) -> None:
    """generation counts spec changes only: a label change bumps resourceVersion, not generation."""
    created = await create_vs(kube_api)
    patched = await patch_vs(kube_api, {"metadata": {"labels": {"a": "b"}}},
                             content_type="application/merge-patch+json")
    assert patched["metadata"]["generation"] == 1
    assert patched["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]


async def test_status_is_ignored_on_custom_resource_writes(kube_api: ApiClient) -> None:
    """The status subresource owns status: writes to the main resource drop it."""
    body = virtual_service() | {"status": {"observedGeneration": 5}}
    created = await create_vs(kube_api, body)
    assert "status" not in created


async def test_strategic_merge_on_custom_resource_is_415(kube_api: ApiClient) -> None:
    """Custom resources do not accept strategic merge patch (415), as on a real server."""
    await create_vs(kube_api)
    with pytest.raises(ApiException) as caught:
        await patch_vs(kube_api, {"spec": {"hosts": ["x"]}},
                       content_type="application/strategic-merge-patch+json")
    assert caught.value.status == 415


async def test_strategic_merge_on_core_type_merges(kube_api: ApiClient) -> None:
    """A strategic merge patch on a ConfigMap (the client's default for dicts) merges keys."""
    core = CoreV1Api(kube_api)
    await core.create_namespaced_config_map(NS, {"metadata": {"name": "c"}, "data": {"a": "1"}})
    patched = await core.patch_namespaced_config_map("c", NS, {"data": {"b": "2"}})
    assert patched.data == {"a": "1", "b": "2"}


# ---- validation ------------------------------------------------------------------------------


async def test_invalid_custom_object_is_422_with_field_path(kube_api: ApiClient,
                                                            kube_emulator: KubeEmulator) -> None:
    """A typo'd field (strict CRD schema) answers 422 Invalid naming the field; nothing is stored."""
    body = virtual_service()
    body["spec"]["http"][0]["route"][1]["wieght"] = body["spec"]["http"][0]["route"][1].pop("weight")
    with pytest.raises(ApiException) as caught:
        await create_vs(kube_api, body)
    status = status_of(caught.value)
    assert caught.value.status == 422 and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.http[0].route[1]"
    assert "wieght" in status["message"]
    assert kube_emulator.get("virtualservices", NS, "reviews") is None


async def test_wrong_type_in_patch_is_422(kube_api: ApiClient) -> None:
    """A patch that makes a weight a string answers 422 with the weight's path."""
    await create_vs(kube_api)
    with pytest.raises(ApiException) as caught:
        await patch_vs(kube_api, [{"op": "replace", "path": "/spec/http/0/route/1/weight", "value": "10"}])
    assert status_of(caught.value)["details"]["causes"][0]["field"] == "spec.http[0].route[1].weight"


async def test_invalid_core_object_is_422(kube_api: ApiClient) -> None:
    """Core types are validated with kubernetes_validate's strict schemas (Lease duration must be int)."""
    with pytest.raises(ApiException) as caught:
        await CoordinationV1Api(kube_api).create_namespaced_lease(NS, {
            "metadata": {"name": "l"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": "15"}})
    assert caught.value.status == 422
    assert status_of(caught.value)["details"]["causes"][0]["field"] == "spec.leaseDurationSeconds"


def test_seed_refuses_invalid_object(kube_emulator: KubeEmulator) -> None:
    """The direct state API validates too, so tests cannot start from an impossible cluster."""
    body = virtual_service()
    body["spec"]["http"][0]["route"][0]["weight"] = "ninety"
    with pytest.raises(InvalidObject):
        kube_emulator.seed(body)


async def test_recorded_writes_are_schema_valid(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """Every object in the record of writes validates against the real schemas."""
    await create_vs(kube_api)
    await patch_vs(kube_api, [{"op": "replace", "path": "/spec/http/0/route/1/weight", "value": 0}])
    assert len(kube_emulator.writes) == 2
    assert all(object_errors(w.object) == [] for w in kube_emulator.writes)


# ---- core kinds ------------------------------------------------------------------------------


async def test_endpoint_slices_list_by_service_name_label(kube_api: ApiClient,
                                                          kube_emulator: KubeEmulator) -> None:
    """EndpointSlices are listed by the kubernetes.io/service-name label selector."""
    for name, service in (("triton-a", "triton"), ("triton-b", "triton"), ("other-a", "other")):
        kube_emulator.seed({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8000}],
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}],
        })
    slices = await DiscoveryV1Api(kube_api).list_namespaced_endpoint_slice(
        NS, label_selector="kubernetes.io/service-name=triton")
    assert sorted(s.metadata.name for s in slices.items) == ["triton-a", "triton-b"]


async def test_lease_replace_round_trip(kube_api: ApiClient) -> None:
    """A Lease read, then replaced with its resourceVersion, takes the new holder."""
    api = CoordinationV1Api(kube_api)
    await api.create_namespaced_lease(NS, {"metadata": {"name": "leader"},
                                           "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})
    lease = await api.read_namespaced_lease("leader", NS)
    lease.spec.holder_identity = "b"
    replaced = await api.replace_namespaced_lease("leader", NS, lease)
    assert replaced.spec.holder_identity == "b"
    assert int(replaced.metadata.resource_version) > int(lease.metadata.resource_version)


async def test_event_create_is_validated_and_stored(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """A core/v1 Event as an executor would record it is accepted and stored."""
    await CoreV1Api(kube_api).create_namespaced_event(NS, {
        "metadata": {"generateName": "reviews."},
        "involvedObject": {"kind": "VirtualService", "name": "reviews", "namespace": NS},
        "reason": "WeightsShifted", "message": "v2 -> 0", "type": "Normal",
    })
    assert [e["reason"] for e in kube_emulator.objects("events", NS)] == ["WeightsShifted"]


async def test_delete_then_get_is_404(kube_api: ApiClient) -> None:
    """A deleted object is gone."""
    await create_vs(kube_api)
    api = CustomObjectsApi(kube_api)
    await api.delete_namespaced_custom_object(*ISTIO, NS, "virtualservices", "reviews")
    with pytest.raises(ApiException) as caught:
        await api.get_namespaced_custom_object(*ISTIO, NS, "virtualservices", "reviews")
    assert caught.value.status == 404


async def test_httproute_is_served(kube_api: ApiClient) -> None:
    """Gateway API HTTPRoutes (v1) are served and validated like the other CRs."""
    created = await CustomObjectsApi(kube_api).create_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", NS, "httproutes", {
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "triton"},
            "spec": {"rules": [{"backendRefs": [{"name": "triton", "port": 8000, "weight": 100}]}]},
        })
    assert created["metadata"]["generation"] == 1


# ---- faults, hooks, records ----------------------------------------------------------------


async def test_forbidden_fault_answers_rbac_status_once(kube_api: ApiClient,
                                                        kube_emulator: KubeEmulator) -> None:
    """A 403 fault answers a Forbidden Status naming user, verb and resource; the request is recorded."""
    await create_vs(kube_api)
    kube_emulator.forbid("patch", "virtualservices")
    with pytest.raises(ApiException) as caught:
        await patch_vs(kube_api, [{"op": "replace", "path": "/spec/http/0/route/1/weight", "value": 0}])
    status = status_of(caught.value)
    assert caught.value.status == 403 and status["reason"] == "Forbidden"
    assert 'cannot patch resource "virtualservices" in API group "networking.istio.io"' in status["message"]
    assert [r.status for r in kube_emulator.requests_for("patch", "virtualservices")] == [403]


async def test_fault_with_times_stops_after_n(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """A 500 fault with times=1 fails one request; the next one succeeds."""
    await create_vs(kube_api)
    fault = kube_emulator.inject("get", "virtualservices", status=500, times=1)
    api = CustomObjectsApi(kube_api)
    with pytest.raises(ApiException) as caught:
        await api.get_namespaced_custom_object(*ISTIO, NS, "virtualservices", "reviews")
    assert caught.value.status == 500 and status_of(caught.value)["reason"] == "InternalError"
    assert (await api.get_namespaced_custom_object(*ISTIO, NS, "virtualservices", "reviews"))["kind"]
    assert fault.fired == 1


async def test_latency_fault_delays_the_answer(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """A latency fault delays matching requests by at least the given seconds."""
    await create_vs(kube_api)
    kube_emulator.inject("get", "virtualservices", latency_seconds=0.2)
    started = time.monotonic()
    await CustomObjectsApi(kube_api).get_namespaced_custom_object(*ISTIO, NS, "virtualservices", "reviews")
    assert time.monotonic() - started >= 0.2


async def test_after_hook_simulates_a_concurrent_edit(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """A hook that edits right after a GET makes the reader's follow-up PUT stale (409)."""
    await create_vs(kube_api)
    kube_emulator.after("get", "virtualservices", lambda emu, rec: emu.modify(
        "virtualservices", rec.namespace, rec.name, lambda o: o["metadata"].setdefault("labels", {}).update(x="y")))
    api = CustomObjectsApi(kube_api)
    read = await api.get_namespaced_custom_object(*ISTIO, NS, "virtualservices", "reviews")
    with pytest.raises(ApiException) as caught:
        await api.replace_namespaced_custom_object(*ISTIO, NS, "virtualservices", "reviews", read)
    assert caught.value.status == 409


async def test_requests_are_recorded_with_verb_and_content_type(kube_api: ApiClient,
                                                                kube_emulator: KubeEmulator) -> None:
    """The request record keeps verb, resource, name, content type, parsed body and status."""
    await create_vs(kube_api)
    await patch_vs(kube_api, [{"op": "replace", "path": "/spec/http/0/route/1/weight", "value": 0}])
    create, patch = kube_emulator.requests
    assert (create.verb, create.status, create.name) == ("create", 201, None)
    assert (patch.verb, patch.resource, patch.name, patch.status) == ("patch", "virtualservices", "reviews", 200)
    assert patch.content_type == "application/json-patch+json" and patch.body[0]["op"] == "replace"
