"""Steps of the system clock change nothing inside a running daemon: a cooldown neither ends early
on a step forward nor stretches on a step back, polling goes on through a step back, and the step
is measured (`tailguard_clock_step_seconds`).

The daemon is given a system clock the test steps (`Service(wall=...)`): the real clock plus an
offset. Everything else is real: the webhook, the journal, the notify receiver, the poller's HTTP
queries.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import AsyncIterator

import pytest
from aiohttp import web

from daemon.http.status import build_status
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.ports import free_port
from tests.support.helpers import NotifySink, local_settings, notify_policy, payload_with, post_alerts, wait_for

pytestmark = pytest.mark.integration

HOUR = 3600.0
POLLED = """
name: scorer-watch
target: {model: scorer, triton: {endpoints: ["http://127.0.0.1:9"]}}
triggers:
  - detector:
      type: threshold
      query: up_metric{model="$model"}
      interval: 1s
      params: {threshold: 1.0e12}
actions:
  - type: triton.rollback
"""


class SteppedWall:
    """The system clock as the test sets it: real time plus `offset`."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class CountingPrometheus:
    def __init__(self) -> None:
        self.queries = 0
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.queries += 1
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": []}})


@pytest.fixture
async def prometheus() -> AsyncIterator[CountingPrometheus]:
    fake = CountingPrometheus()
    app = web.Application()
    app.router.add_route("*", "/api/v1/query_range", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    await runner.cleanup()


async def test_a_clock_step_forward_or_back_neither_ends_nor_stretches_a_cooldown_nor_stops_polling(
        tmp_path: Path, prometheus: CountingPrometheus) -> None:
    wall = SteppedWall()
    async with NotifySink() as sink:
        policies = tmp_path / "policies"
        policies.mkdir()
        (policies / "notify.yaml").write_text(notify_policy(sink.url, guards="cooldown: 1h"))
        (policies / "polled.yaml").write_text(POLLED)
        settings = local_settings(tmp_path, policies, prometheus={"url": prometheus.url})
        async with Service(settings, action_registry(), detector_registry(), wall=wall) as svc:
            step = lambda: svc.metrics.registry.get_sample_value("tailguard_clock_step_seconds")  # noqa: E731
            await post_alerts(svc, payload_with(fingerprint="a1"), expect=200, drain=True)
            assert len(sink.received) == 1  # acted: the cooldown starts

            wall.offset += 2 * HOUR  # forward past the cooldown on the system clock
            assert step() == pytest.approx(2 * HOUR, abs=5)
            await post_alerts(svc, payload_with(fingerprint="a2"), expect=200, drain=True)
            assert len(sink.received) == 1, "a step forward ended the cooldown"

            wall.offset -= 3 * HOUR  # back an hour before the daemon started
            assert step() == pytest.approx(-HOUR, abs=5)
            polled = prometheus.queries
            await wait_for(lambda: prometheus.queries >= polled + 2, timeout=30)  # polling goes on
            doc = build_status(await svc.status_inputs())
            (left,) = [r["cooldownLeftSeconds"] for t in doc["targets"] for r in t["policies"]
                       if r["policy"] == "ranker-notify"]
            assert 0 < left <= HOUR, "a step back stretched the cooldown"
            states = [d.state for d in await svc.journal.decisions.all.in_thread()]
            assert states.count("succeeded") == 1 and len(states) == 2, states
