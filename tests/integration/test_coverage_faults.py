"""Nothing fails silently: a query group that fails is down on its own gauge while the others stay
up (Prometheus is "down" only when every group fails); an answer of 200 without `data` is that
query's error, not the poller's; a model whose metrics vanish is named in /readyz and as a gauge,
and its detector gauges go with its data; with `source: triton`, one unreachable replica leaves the
others watched.

Prometheus is a small HTTP endpoint here: the faults (a malformed 200, a series that vanishes on cue)
are what a real one cannot be made to produce; Triton is the real server.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.ports import free_port
from tests.support.helpers import local_settings, wait_for

pytestmark = pytest.mark.integration


def threshold_policy(name: str, model: str, metric: str, target: str, source: str = "prometheus") -> str:
    return f"""
name: {name}
target: {{model: {model}, triton: {target}}}
triggers:
  - detector:
      type: threshold
      source: {source}
      query: {metric}{{model="$model"}}
      interval: 1s
      params: {{threshold: 1.0e12, max_staleness_seconds: 3}}
actions:
  - type: triton.rollback
"""


class FakePrometheus:
    """Answers `good_metric` with a series of `model` (`None`: of another model: the metric
    vanished for the watched one) and `broken_metric` with 200 and no `data`."""

    def __init__(self) -> None:
        self.model: str | None = "ranker"
        self.url = ""

    async def query_range(self, request: web.Request) -> web.Response:
        params = {**request.query, **(await request.post())}
        if "broken_metric" in str(params.get("query")):
            return web.json_response({"status": "success"})  # 200 without data
        start, end = float(str(params["start"])), float(str(params["end"]))
        step = float(str(params["step"]).rstrip("s"))
        grid = [math.ceil(start / step) * step + i * step for i in range(int((end - start) / step) + 1)]
        result = [{"metric": {"__name__": "good_metric", "model": self.model or "other"},
                   "values": [[t, "1"] for t in grid if t <= end]}]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})


@pytest.fixture
async def prometheus() -> AsyncIterator[FakePrometheus]:
    fake = FakePrometheus()
    app = web.Application()
    app.router.add_route("*", "/api/v1/query_range", fake.query_range)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    await runner.cleanup()


async def _get(svc: Service, path: str) -> Any:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{svc.port}{path}") as r:
            return await (r.json() if path == "/readyz" else r.text())


def _sample(svc: Service, name: str, **labels: str) -> float | None:
    return svc.metrics.registry.get_sample_value(name, labels)


async def test_a_partial_failure_a_malformed_answer_and_a_vanished_metric_are_each_said(
        tmp_path: Path, prometheus: FakePrometheus) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    endpoints = '{endpoints: ["http://127.0.0.1:9"]}'
    (policies / "good.yaml").write_text(threshold_policy("ranker-tail", "ranker", "good_metric", endpoints))
    (policies / "broken.yaml").write_text(threshold_policy("scorer-tail", "scorer", "broken_metric", endpoints))
    settings = local_settings(tmp_path, policies, prometheus={"url": prometheus.url, "maxBackoffSeconds": 1})
    async with Service(settings, action_registry(), detector_registry()) as svc:
        poller = svc.poller
        assert poller is not None
        await wait_for(lambda: bool(poller.stale_queries()) and poller.latest("ranker-tail", 0) is not None,
                       timeout=30)
        groups = {g.query: g for g in poller.groups.values()}
        good = next(g for q, g in groups.items() if "good_metric" in q)
        broken = next(g for q, g in groups.items() if "broken_metric" in q)

        ready = await _get(svc, "/readyz")
        (stale,) = ready["stale_queries"]
        assert stale["group"] == broken.id and "KeyError" in stale["error"], stale
        assert _sample(svc, "tailguard_query_up", group=broken.id, source="prometheus") == 0
        assert _sample(svc, "tailguard_query_up", group=good.id, source="prometheus") == 1
        assert _sample(svc, "tailguard_prometheus_up") == 1  # one bad query is not Prometheus away
        assert _sample(svc, "tailguard_faults_total", component="poller") is None  # no uncaught KeyError
        value = {"policy": "ranker-tail", "trigger": "0", "detector": "threshold", "series": "model=ranker"}
        assert _sample(svc, "tailguard_detector_value", **value) == 1
        assert ready["vanished_metrics"] == []

        prometheus.model = None  # the watched model's series vanish (another model's remain; the
        # range still holds the old points for the lookback, as Prometheus's would)
        await wait_for(lambda: bool(poller.vanished()), timeout=30)
        ready = await _get(svc, "/readyz")
        (gone,) = ready["vanished_metrics"]
        assert (gone["policy"], gone["trigger"], gone["model"]) == ("ranker-tail", 0, "ranker")
        assert _sample(svc, "tailguard_detector_no_data", policy="ranker-tail", trigger="0") == 1
        assert _sample(svc, "tailguard_detector_value", **value) is None  # stale with its data

        prometheus.model = "ranker"  # back
        await wait_for(lambda: not poller.vanished(), timeout=30)
        assert _sample(svc, "tailguard_detector_no_data", policy="ranker-tail", trigger="0") == 0
        assert _sample(svc, "tailguard_detector_value", **value) == 1
        assert await svc.journal.signals.all.in_thread() == []


async def test_one_unreachable_replica_leaves_the_others_watched(
        tmp_path: Path, prometheus: FakePrometheus, triton_factory: Any) -> None:
    """`source: triton` over two replicas, one of them down: the live one's series are judged, and
    the group is named partial with the dead replica's error (down on its gauge, never in sync)."""
    server = await triton_factory(name="ranker")
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    target = (f'{{endpoints: ["{server.base_url}"], metricsEndpoints: ["{server.metrics_url}", "{dead}"]}}')
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(threshold_policy("ranker-tail", "ranker", "nv_inference_count", target,
                                                      source="triton"))
    settings = local_settings(tmp_path, policies, prometheus={"url": prometheus.url})
    async with Service(settings, action_registry(), detector_registry()) as svc:
        poller = svc.poller
        assert poller is not None
        await wait_for(lambda: poller.latest("ranker-tail", 0) is not None, timeout=60)
        latest = poller.latest("ranker-tail", 0)
        assert latest is not None and latest.series
        live = server.metrics_url.split("//", 1)[-1].split("/", 1)[0]
        assert {labels["instance"] for labels in latest.series} == {live}
        (partial,) = poller.stale_queries()
        assert partial["partial"] is True and dead in partial["error"], partial
        assert _sample(svc, "tailguard_query_up", group=partial["group"], source="triton") == 0
        assert (await _get(svc, "/readyz"))["stale_queries"][0]["partial"] is True
