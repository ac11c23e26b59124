"""Prometheus down or slow: the poller backs off, marks the query stale in /readyz and /metrics,
and never acts on missing data."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.ports import free_port
from tests.support.helpers import local_settings, wait_for

POLICY = """
name: ranker-tail
target: {model: ranker, triton: {endpoints: ["http://127.0.0.1:9"]}}
triggers:
  - detector:
      type: threshold
      query: max by (model) (nv_inference_request_summary_us{model="$model", quantile="0.999"})
      interval: 1s
      params: {threshold: 500000}
actions:
  - type: triton.rollback
"""


@pytest.fixture
async def slow_prometheus() -> AsyncIterator[str]:
    """An HTTP endpoint that answers slower than the client's timeout, like an overloaded Prometheus."""
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        try:
            await asyncio.wait_for(release.wait(), timeout=3)
        except asyncio.TimeoutError:
            pass
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": []}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/query_range", slow)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    release.set()  # let pending slow answers finish so no handler task outlives the test
    await asyncio.sleep(0.05)
    await runner.cleanup()


async def test_prometheus_down_marks_stale_and_never_acts(tmp_path: Path):
    """Nothing listens: connection refused."""
    await _check_stale(tmp_path, f"http://127.0.0.1:{free_port()}")


async def test_prometheus_slow_marks_stale_and_never_acts(tmp_path: Path, slow_prometheus: str):
    """Answers arrive after the client's timeout."""
    await _check_stale(tmp_path, slow_prometheus)


async def _check_stale(tmp_path: Path, url: str) -> None:
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "p.yaml").write_text(POLICY)
    settings = local_settings(tmp_path, pol, prometheus={"url": url, "timeoutSeconds": 0.5,
                                                         "maxBackoffSeconds": 2})
    async with Service(settings, action_registry(), detector_registry()) as svc:
        await wait_for(lambda: bool(svc.poller and svc.poller.stale_queries()), timeout=15)
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{svc.port}"
            async with http.get(base + "/readyz") as r:
                detail = await r.json()
            async with http.get(base + "/metrics") as r:
                metrics = await r.text()
        (stale,) = detail["stale_queries"]
        assert 'model=\\"ranker\\"' in stale["query"] or 'model="ranker"' in stale["query"]
        assert stale["error"] and stale["failures"] >= 1
        assert "tailguard_prometheus_up 0.0" in metrics
        assert "tailguard_stale_queries 1.0" in metrics
        group = next(iter(svc.poller.groups.values()))
        assert group.next_due > svc.clock()  # backing off, not hammering
        assert await svc.journal.signals.all.in_thread() == []
        assert await svc.journal.decisions.all.in_thread() == []
