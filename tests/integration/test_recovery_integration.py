"""Recovery after acting, through the running daemon against a real Prometheus scraping a gauge the
test controls: a series that drops below the line is journaled recovered; one that stays high is
escalated (the receiver gets it, the target is frozen, the next signal blocked); a verify query
with no data ends unknown and escalates too. Windows are seconds long (for 2s, within 8s, interval 1s)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from daemon.storage.records import Decision, StepRow
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.prometheus import PrometheusServer
from tests.support.helpers import TOKEN, NotifySink, local_settings, payload_with
from tests.support.kube_helpers import GaugeExporter
from tests.support.lab_fixtures import PrometheusFactory

pytestmark = pytest.mark.integration

GAUGE = 'tg_verify_p999_ms{model="ranker"}'
POLICY = """
name: ranker-tail
target: {{model: ranker}}
triggers:
  - alert: {{name: TritonTailLatencyHigh, matchers: {{severity: page}}}}
actions:
  - type: notify
    url: {step_url}
guards: {{cooldown: 0s}}
verify:
  query: max(tg_verify_{metric}{{model="$model"}})
  below: 500
  for: 2s
  within: 8s
  interval: 1s
  onNotRecovered: escalate
"""


@pytest.fixture
async def gauge() -> AsyncIterator[GaugeExporter]:
    async with GaugeExporter() as exporter:
        exporter.values[GAUGE] = 900.0
        yield exporter


@pytest.fixture
async def prometheus(prometheus_factory: PrometheusFactory, gauge: GaugeExporter) -> PrometheusServer:
    """A real Prometheus scraping the gauge every second, once it has the gauge's first sample."""
    server = await prometheus_factory(scrape_targets={"gauge": [gauge.target]}, scrape_interval="1s")
    async with aiohttp.ClientSession() as http:
        for _ in range(150):
            async with http.get(f"{server.url}/api/v1/query", params={"query": "tg_verify_p999_ms"}) as resp:
                if (await resp.json())["data"]["result"]:
                    return server
            await asyncio.sleep(0.1)
    raise AssertionError("Prometheus never scraped the gauge")


async def _alert(svc: Service, starts_at: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{svc.port}/api/v1/alerts", json=payload_with(starts_at=starts_at),
                             headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200


def _service(tmp_path: Path, prometheus: PrometheusServer, step_sink: NotifySink, receiver: NotifySink,
             metric: str = "p999_ms") -> Service:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "ranker.yaml").write_text(POLICY.format(step_url=step_sink.url, metric=metric))
    settings = local_settings(tmp_path, pol, prometheus={"url": prometheus.url},
                              notifications=[{"url": receiver.url}],
                              executor={"workers": 2, "escalationFreezeSeconds": 3600})
    return Service(settings, action_registry(), detector_registry())


async def _recovery(svc: Service, decision_id: int) -> list[StepRow]:
    return [s for s in await svc.journal.decisions.steps.in_thread(decision_id) if s.phase == "recovery"]


async def _act_and_settle(svc: Service) -> tuple[Decision, list[StepRow]]:
    """One alert acted on, its recovery watched to the verdict: the decision and its recovery rows."""
    await _alert(svc, "2026-11-29T17:00:00Z")
    await svc.drain()
    await svc.executor.wait_recoveries()
    (decision,) = await svc.journal.decisions.all.in_thread()
    return decision, await _recovery(svc, decision.id)


async def test_series_that_drops_below_the_line_is_journaled_recovered(
        tmp_path: Path, prometheus: PrometheusServer, gauge: GaugeExporter):
    """The plan acts while P99.9 is 900; the gauge then drops to 100: recovered, nothing frozen,
    the receiver gets `acted` and `recovered`."""
    async with NotifySink() as step_sink, NotifySink() as receiver:
        async with _service(tmp_path, prometheus, step_sink, receiver) as svc:
            await _alert(svc, "2026-11-29T17:00:00Z")
            await svc.drain()
            (decision,) = await svc.journal.decisions.all.in_thread()
            assert decision.state == "succeeded", decision.reason
            assert len(step_sink.received) == 1  # the notify step itself
            gauge.values[GAUGE] = 100.0
            await svc.executor.wait_recoveries()
            rows = await _recovery(svc, decision.id)
            assert [r.status for r in rows] == ["pending", "recovered"], rows[-1].message
            assert rows[0].data["check"]["query"] == 'max(tg_verify_p999_ms{model="ranker"})'
            assert await svc.journal.freezes.all.in_thread() == []
            await svc.parts.notifier.flush()
        assert [e["event"] for e in receiver.received] == ["acted", "recovered"]


async def test_series_that_stays_high_escalates_freezes_and_blocks_the_next_signal(
        tmp_path: Path, prometheus: PrometheusServer):
    """P99.9 stays at 900: not recovered at the end of the window; the receiver gets the escalation,
    the target is frozen, and a second alert is blocked with the freeze's reason."""
    async with NotifySink() as step_sink, NotifySink() as receiver:
        async with _service(tmp_path, prometheus, step_sink, receiver) as svc:
            decision, rows = await _act_and_settle(svc)
            assert [r.status for r in rows] == ["pending", "not_recovered"]
            assert "last bad value 900" in rows[1].message and rows[1].data["samples"] >= 5
            (freeze,) = await svc.journal.freezes.all.in_thread()
            assert freeze.target == "default/ranker" and freeze.decision_id == decision.id

            await _alert(svc, "2026-11-29T17:05:00Z")
            await svc.drain()
            _, second = await svc.journal.decisions.all.in_thread()
            assert second.state == "blocked" and second.reason.startswith("target frozen: ")
            assert len(step_sink.received) == 1  # the blocked plan sent nothing
            await svc.parts.notifier.flush()
        events = [e["event"] for e in receiver.received]
        assert events == ["acted", "not_recovered", "escalated"]
        escalated = receiver.received[-1]
        assert escalated["target"] == "default/ranker" and escalated["decision"] == decision.id


async def test_verify_query_without_data_ends_unknown_and_escalates(tmp_path: Path, prometheus: PrometheusServer):
    """A verify query that returns no series: unknown (never success), escalated and frozen."""
    async with NotifySink() as step_sink, NotifySink() as receiver:
        async with _service(tmp_path, prometheus, step_sink, receiver, metric="missing_series") as svc:
            _, rows = await _act_and_settle(svc)
            assert [r.status for r in rows] == ["pending", "unknown"]
            assert "no data" in rows[1].message
            assert await svc.journal.freezes.active_on.in_thread("default/ranker") is not None
            await svc.parts.notifier.flush()
        assert [e["event"] for e in receiver.received] == ["acted", "not_recovered", "escalated"]
        assert receiver.received[1]["verdict"] == "unknown"
