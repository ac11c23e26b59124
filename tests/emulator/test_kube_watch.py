"""The emulator's watches behave as the API server's watch cache, through the real
kubernetes_asyncio client and its Watch: initial state, resume from a resourceVersion, selector
transitions, bookmarks, 410 Gone on a compacted version, timeouts and ended streams."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiClient, DiscoveryV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from lab.kube.emulator import KubeEmulator
from tests.support.kube.conftest_plugin import kube_api, kube_emulator  # noqa: F401  (fixtures)
from tests.support.helpers import wait_for

NS = "serving"
SELECTOR = "kubernetes.io/service-name=ranker"


def endpoint_slice(name: str, ready: bool = True, service: str = "ranker", ip: str = "10.0.0.1") -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": service}},
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}],
    }


def set_ready(ready: bool) -> Any:
    def change(obj: dict[str, Any]) -> None:
        obj["endpoints"][0]["conditions"]["ready"] = ready
    return change


async def collect(api: ApiClient, count: int, **kwargs: Any) -> list[tuple[str, Any]]:
    """The first `count` events (type, raw object) of a watch of ranker's slices."""
    events: list[tuple[str, Any]] = []
    w = watch.Watch()
    try:
        async with asyncio.timeout(20):
            async for event in w.stream(DiscoveryV1Api(api).list_namespaced_endpoint_slice, NS,
                                        label_selector=SELECTOR, **kwargs):
                events.append((event["type"], event["raw_object"]))
                if len(events) == count:
                    break
    finally:
        await w.close()
    return events


async def test_a_watch_without_a_version_starts_with_the_objects_that_exist_then_follows(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """Synthetic ADDED per existing object (selector applied), then live changes in order."""
    kube_emulator.seed(endpoint_slice("ranker-a"))
    kube_emulator.seed(endpoint_slice("other-a", service="other"))
    task = asyncio.ensure_future(collect(kube_api, 4, timeout_seconds=30))
    await wait_for(lambda: kube_emulator.watchers == 1, timeout=10)
    kube_emulator.seed(endpoint_slice("ranker-b", ip="10.0.0.2"))
    kube_emulator.modify("endpointslices", NS, "ranker-a", set_ready(False))
    kube_emulator.delete("endpointslices", NS, "ranker-b")
    events = await task
    assert [(t, o["metadata"]["name"]) for t, o in events] == [
        ("ADDED", "ranker-a"), ("ADDED", "ranker-b"), ("MODIFIED", "ranker-a"), ("DELETED", "ranker-b")]
    assert events[2][1]["endpoints"][0]["conditions"]["ready"] is False
    assert events[0][1]["kind"] == "EndpointSlice" and events[0][1]["apiVersion"] == "discovery.k8s.io/v1"
    rvs = [int(o["metadata"]["resourceVersion"]) for _, o in events[1:]]
    assert rvs == sorted(rvs) and rvs[-1] == kube_emulator.resource_version


async def test_a_watch_from_a_version_replays_only_what_changed_after_it(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """From the list's resourceVersion: no synthetic ADDED, the changes since, in order."""
    kube_emulator.seed(endpoint_slice("ranker-a"))
    listed = await DiscoveryV1Api(kube_api).list_namespaced_endpoint_slice(NS, label_selector=SELECTOR)
    kube_emulator.modify("endpointslices", NS, "ranker-a", set_ready(False))
    kube_emulator.seed(endpoint_slice("ranker-b", ip="10.0.0.2"))
    events = await collect(kube_api, 2, resource_version=listed.metadata.resource_version, timeout_seconds=30)
    assert [(t, o["metadata"]["name"]) for t, o in events] == [("MODIFIED", "ranker-a"), ("ADDED", "ranker-b")]


async def test_an_object_leaving_or_entering_the_selection_is_deleted_or_added(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A relabel out of the selector is DELETED for the watch; back in, ADDED (the watch cache's rule)."""
    kube_emulator.seed(endpoint_slice("ranker-a"))
    listed = await DiscoveryV1Api(kube_api).list_namespaced_endpoint_slice(NS, label_selector=SELECTOR)

    def relabel(service: str) -> Any:
        def change(obj: dict[str, Any]) -> None:
            obj["metadata"]["labels"]["kubernetes.io/service-name"] = service
        return change

    kube_emulator.modify("endpointslices", NS, "ranker-a", relabel("other"))
    kube_emulator.modify("endpointslices", NS, "ranker-a", set_ready(False))  # outside: not sent
    kube_emulator.modify("endpointslices", NS, "ranker-a", relabel("ranker"))
    events = await collect(kube_api, 2, resource_version=listed.metadata.resource_version, timeout_seconds=30)
    assert [t for t, _ in events] == ["DELETED", "ADDED"]
    assert events[1][1]["endpoints"][0]["conditions"]["ready"] is False


async def test_bookmarks_carry_the_resource_version_while_nothing_changes(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """allowWatchBookmarks: BOOKMARK events with only metadata.resourceVersion; none unasked."""
    kube_emulator.bookmark_interval_seconds = 0.1
    kube_emulator.seed(endpoint_slice("ranker-a"))
    events = await collect(kube_api, 2, resource_version=str(kube_emulator.resource_version),
                           allow_watch_bookmarks=True, timeout_seconds=30)
    assert [t for t, _ in events] == ["BOOKMARK", "BOOKMARK"]
    assert events[0][1]["metadata"] == {"resourceVersion": str(kube_emulator.resource_version)}
    without = await collect(kube_api, 1, resource_version=str(kube_emulator.resource_version), timeout_seconds=1)
    assert without == []  # the server-side timeout ended it before any bookmark


async def test_a_watch_from_a_compacted_version_is_answered_410_gone(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """After compaction an older resourceVersion is too old: an ERROR event with a 410 Expired
    Status, which the client raises as ApiException(410) (it must list again)."""
    kube_emulator.seed(endpoint_slice("ranker-a"))
    old = str(kube_emulator.resource_version)
    kube_emulator.modify("endpointslices", NS, "ranker-a", set_ready(False))
    kube_emulator.compact()
    with pytest.raises(ApiException) as raised:
        await collect(kube_api, 1, resource_version=old, timeout_seconds=30)
    assert raised.value.status == 410 and "too old resource version" in str(raised.value.reason)
    current = str(kube_emulator.resource_version)
    kube_emulator.seed(endpoint_slice("ranker-b", ip="10.0.0.2"))
    assert [t for t, _ in await collect(kube_api, 1, resource_version=current, timeout_seconds=30)] == ["ADDED"]


async def test_ended_streams_end_the_clients_iteration(kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """end_watches() closes every open stream (an API server restart): the client's stream ends."""
    task = asyncio.ensure_future(collect(kube_api, 5, resource_version=str(kube_emulator.resource_version),
                                         timeout_seconds=30))
    await wait_for(lambda: kube_emulator.watchers == 1, timeout=10)
    kube_emulator.end_watches()
    assert await asyncio.wait_for(task, timeout=10) == []
    assert kube_emulator.watchers == 0
