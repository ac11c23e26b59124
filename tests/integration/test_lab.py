"""The lab's servers really run: Triton serves and rolls back, Prometheus scrapes and backfills,
Alertmanager delivers a webhook with its bearer token."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import tritonclient.http as triton_http
from aiohttp import web

from lab.load import run_load
from lab.ports import LOOPBACK, free_port
from lab.process import ManagedProcess, ProcessStartError
from lab.prometheus import BackfillSeries, backfill_openmetrics, openmetrics_text
from lab.triton import TritonServer
from tests.support.lab_fixtures import AlertmanagerFactory, PrometheusFactory

INFER_BODY = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}


async def _poll_json(session: aiohttp.ClientSession, url: str, params: dict[str, str], timeout_seconds: float) -> Any:
    """GET `url` until its Prometheus-style ``data.result`` is non-empty; bounded by a deadline."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        async with session.get(url, params=params) as response:
            body = await response.json()
        if body["data"]["result"] or time.monotonic() > deadline:
            return body
        await asyncio.sleep(0.5)


@pytest.mark.integration
def test_wait_ready_fails_fast_when_the_process_exits(tmp_path: Path) -> None:
    """A server that dies at start is reported at once with its log, not after the deadline."""
    process = ManagedProcess(argv=["sh", "-c", "echo boom; exit 3"], log_path=tmp_path / "log")
    process.start()
    started = time.monotonic()
    with pytest.raises(ProcessStartError, match="boom"):
        process.wait_ready(f"http://{LOOPBACK}:{free_port()}/", timeout_seconds=20)
    assert time.monotonic() - started < 5
    assert process.stop() == 3


@pytest.mark.integration
def test_stop_ends_a_process_that_never_became_ready(tmp_path: Path) -> None:
    """The deadline bounds the wait, and stop() ends our own child by PID."""
    process = ManagedProcess(argv=["sleep", "60"], log_path=tmp_path / "log")
    process.start()
    with pytest.raises(ProcessStartError, match="not ready"):
        process.wait_ready(f"http://{LOOPBACK}:{free_port()}/", timeout_seconds=0.5)
    assert process.stop(grace_seconds=5) == -15
    assert not process.running


@pytest.mark.integration
async def test_triton_serves_v2_with_p999_summary(triton_server: TritonServer) -> None:
    """Fresh load serves only v2 (latest), answers an inference, and exposes the 0.999 quantile."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{triton_server.base_url}/v2/models/ranker") as response:
            assert (await response.json())["versions"] == ["2"]
        async with session.post(f"{triton_server.base_url}/v2/models/ranker/infer", json=INFER_BODY) as response:
            answer = await response.json()
        assert answer["model_version"] == "2"
        assert answer["outputs"][0]["data"] == [1.0, 2.0, 3.0]
        async with session.get(triton_server.metrics_url) as response:
            metrics = await response.text()
    assert 'nv_inference_request_summary_us{model="ranker",version="2",quantile="0.999"}' in metrics


@pytest.mark.integration
async def test_load_generator_reaches_the_model(triton_server: TritonServer) -> None:
    """run_load sends exactly rate x duration requests, unpinned, all answered by v2."""
    result = await run_load(triton_server.base_url, rate_per_second=20, duration_seconds=1.0)
    assert len(result.samples) == 20
    assert not result.errors
    assert {s.model_version for s in result.samples} == {"2"}
    assert 0 < result.quantile_ms(0.5) < 900


async def test_load_generator_refuses_non_loopback() -> None:
    with pytest.raises(ValueError, match="loopback"):
        await run_load("http://example.com:8000", duration_seconds=0.1)


@pytest.mark.integration
async def test_prometheus_scrapes_triton(
    triton_server: TritonServer, prometheus_factory: PrometheusFactory
) -> None:
    """Prometheus scrapes Triton's /metrics and answers a query for its P99.9 summary."""
    async with aiohttp.ClientSession() as session:
        # One inference so the summary has an observation whatever ran before.
        async with session.post(f"{triton_server.base_url}/v2/models/ranker/infer", json=INFER_BODY) as response:
            assert response.status == 200
        prometheus = await prometheus_factory(scrape_targets={"triton": [triton_server.metrics_target]})
        body = await _poll_json(
            session,
            f"{prometheus.url}/api/v1/query",
            {"query": 'nv_inference_request_summary_us{job="triton",model="ranker",quantile="0.999"}'},
            timeout_seconds=20,
        )
    assert body["data"]["result"], prometheus.log_tail()
    assert float(body["data"]["result"][0]["value"][1]) > 0


def test_openmetrics_text_escapes_labels_and_groups_families() -> None:
    text = openmetrics_text(
        [
            BackfillSeries("x", [(2, 1.0), (1, 0.5)], {"model": 'a"b'}),
            BackfillSeries("x", [(1, 3.0)], {"model": "c"}),
        ]
    )
    assert text.count("# TYPE x gauge") == 1
    assert 'x{model="a\\"b"} 0.5 1.0\nx{model="a\\"b"} 1.0 2.0' in text
    assert text.endswith("# EOF\n")


@pytest.mark.integration
async def test_backfilled_history_is_queryable(tmp_path: Path, prometheus_factory: PrometheusFactory) -> None:
    """promtool-backfilled samples from hours ago come back from query_range, values intact."""
    end = int(time.time()) // 60 * 60 - 3600
    samples = [(end - 60 * i, float(i)) for i in range(120)]
    data_dir = tmp_path / "tsdb"
    backfill_openmetrics(data_dir, [BackfillSeries("tailguard_backfill_test", samples, {"model": "ranker"})])
    prometheus = await prometheus_factory(data_dir=data_dir)
    params = {
        "query": 'tailguard_backfill_test{model="ranker"}',
        "start": str(end - 60 * 119),
        "end": str(end),
        "step": "60",
    }
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{prometheus.url}/api/v1/query_range", params=params) as response:
            body = await response.json()
    values = body["data"]["result"][0]["values"]
    assert len(values) == 120
    assert values[0] == [end - 60 * 119, "119"]
    assert values[-1] == [end, "0"]


@pytest.fixture
async def webhook_receiver() -> AsyncIterator[tuple[str, asyncio.Queue[tuple[dict[str, str], Any]]]]:
    """A tiny aiohttp server on loopback that queues (headers, JSON body) of each POST."""
    received: asyncio.Queue[tuple[dict[str, str], Any]] = asyncio.Queue()

    async def handle(request: web.Request) -> web.Response:
        await received.put((dict(request.headers), await request.json()))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/alerts", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, LOOPBACK, port).start()
    try:
        yield f"http://{LOOPBACK}:{port}/alerts", received
    finally:
        await runner.cleanup()


@pytest.mark.integration
async def test_alertmanager_delivers_webhook_with_bearer_token(
    webhook_receiver: tuple[str, asyncio.Queue[tuple[dict[str, str], Any]]],
    alertmanager_factory: AlertmanagerFactory,
) -> None:
    """An alert POSTed to /api/v2/alerts reaches the webhook, authenticated, as payload v4."""
    url, received = webhook_receiver
    alertmanager = await alertmanager_factory(url, bearer_token="s3cret")
    alert = {
        "labels": {"alertname": "RankerTailLatency", "model": "ranker"},
        "annotations": {"summary": "P99.9 high"},
        "startsAt": datetime.now(timezone.utc).isoformat(),
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{alertmanager.url}/api/v2/alerts", json=[alert]) as response:
            assert response.status == 200
    headers, body = await asyncio.wait_for(received.get(), timeout=20)
    assert headers["Authorization"] == "Bearer s3cret"
    assert body["version"] == "4"
    assert body["status"] == "firing"
    assert body["alerts"][0]["labels"] == {"alertname": "RankerTailLatency", "model": "ranker"}


# Last in the file: it changes the shared server, which the fixture then has to reset (~1.5 s).
@pytest.mark.integration
def test_load_model_with_specific_version_rolls_back_to_v1(triton_server: TritonServer) -> None:
    """The daemon's rollback path: version_policy specific [1] via load_model(config=...)."""
    client = triton_http.InferenceServerClient(triton_server.http_url)
    try:
        config = client.get_model_config("ranker")
        config["version_policy"] = {"specific": {"versions": [1]}}
        client.load_model("ranker", config=json.dumps(config))
        assert client.is_model_ready("ranker", "1")
        assert not client.is_model_ready("ranker", "2")
        inputs = [triton_http.InferInput("INPUT0", [2], "FP32")]
        inputs[0].set_data_from_numpy(np.array([4.0, 5.0], dtype=np.float32))
        assert client.infer("ranker", inputs).get_response()["model_version"] == "1"
    finally:
        client.close()
