"""daemon.cluster.endpoint_watch: endpoints that turn ready (added, or back after a restart) are
reported at once, through the real client's watch of the emulator; a compacted version (410)
or a failed watch lists again and reports what turned ready meanwhile."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient

from core.target import ServiceRef
from daemon.cluster.endpoint_watch import EndpointWatch
from daemon.common.metrics import Metrics
from lab.kube.emulator import KubeEmulator
from tests.support.helpers import wait_for
from tests.support.kube.conftest_plugin import kube_api, kube_emulator  # noqa: F401  (fixtures)

NS = "serving"
REF = ServiceRef(NS, "ranker-triton", 8000)


def endpoint_slice(name: str, ips: dict[str, bool]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": REF.name}},
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}} for ip, ready in ips.items()],
    }


def set_endpoints(ips: dict[str, bool]) -> Any:
    def change(obj: dict[str, Any]) -> None:
        obj["endpoints"] = [{"addresses": [ip], "conditions": {"ready": ready}} for ip, ready in ips.items()]
    return change


class Running:
    def __init__(self, watcher: EndpointWatch, task: asyncio.Task[None], reported: list[list[str]]) -> None:
        self.watcher, self.task, self.reported = watcher, task, reported


@pytest.fixture
async def running(kube_api: ApiClient, kube_emulator: KubeEmulator) -> AsyncIterator[Running]:  # noqa: F811
    kube_emulator.bookmark_interval_seconds = 0.2
    kube_emulator.seed(endpoint_slice("ranker-triton-a", {"10.0.0.1": True}))
    reported: list[list[str]] = []
    metrics = Metrics()
    watcher = EndpointWatch(kube_api, lambda: {REF}, lambda ref, urls: reported.append(urls), metrics,
                            resync_seconds=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop), name="endpoint-watch")
    await wait_for(lambda: kube_emulator.watchers == 1, timeout=10)
    yield Running(watcher, task, reported)
    stop.set()
    await asyncio.wait_for(task, timeout=10)


async def test_an_added_endpoint_is_reported_once_it_is_ready_and_the_first_list_is_not(
        running: Running, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """Ready at the first list: not reported (the periodic pass covers it). Added not ready:
    nothing; turned ready: reported."""
    kube_emulator.modify("endpointslices", NS, "ranker-triton-a", set_endpoints({"10.0.0.1": True, "10.0.0.2": False}))
    await asyncio.sleep(0.3)
    assert running.reported == []
    kube_emulator.modify("endpointslices", NS, "ranker-triton-a", set_endpoints({"10.0.0.1": True, "10.0.0.2": True}))
    await wait_for(lambda: running.reported == [["http://10.0.0.2:8000"]], timeout=10)


async def test_a_restarted_endpoint_not_ready_then_ready_is_reported_again(
        running: Running, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A pod restart keeps its address: ready false, then true again, is a new ready replica.
    A second slice of the same Service counts too."""
    kube_emulator.modify("endpointslices", NS, "ranker-triton-a", set_endpoints({"10.0.0.1": False}))
    kube_emulator.modify("endpointslices", NS, "ranker-triton-a", set_endpoints({"10.0.0.1": True}))
    await wait_for(lambda: running.reported == [["http://10.0.0.1:8000"]], timeout=10)
    kube_emulator.seed(endpoint_slice("ranker-triton-b", {"10.0.0.7": True}))
    await wait_for(lambda: running.reported[-1] == ["http://10.0.0.7:8000"], timeout=10)


async def test_after_a_compaction_it_lists_again_and_reports_what_turned_ready_meanwhile(
        running: Running, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """The stream ends, the version it would resume from is compacted away (410): it lists
    again, and the endpoint that turned ready in the gap is reported."""
    kube_emulator.end_watches()
    kube_emulator.modify("endpointslices", NS, "ranker-triton-a", set_endpoints({"10.0.0.1": True, "10.0.0.3": True}))
    kube_emulator.compact()
    await wait_for(lambda: running.reported == [["http://10.0.0.3:8000"]], timeout=20)
    assert running.watcher.lists >= 2  # listed again after the 410


async def test_a_failing_watch_is_counted_and_listed_again(running: Running, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A watch answered 500 is a fault; after the pause it lists and watches again."""
    kube_emulator.inject("watch", "endpointslices", status=500, times=1)
    kube_emulator.end_watches()
    await wait_for(lambda: kube_emulator.watchers == 1 and running.watcher.lists >= 2, timeout=20)
    kube_emulator.modify("endpointslices", NS, "ranker-triton-a", set_endpoints({"10.0.0.1": True, "10.0.0.4": True}))
    await wait_for(lambda: running.reported == [["http://10.0.0.4:8000"]], timeout=10)
