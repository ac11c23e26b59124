"""The histogram path of tail_excess on real servers: the clients' per-version latency histogram
(lab/scenarios/clients.py, a bucket at 500 ms) scraped by real Prometheus every second, the reference
defect on v2 of real Triton (0.5% of requests 900 ms slower), and the daemon range-querying the
bucket and the count: the signal names v2 and the rollback follows. At 100 req/s, not the reference
40: the delay is the evidence's (0.5 slow requests a second here), and at 40 req/s it took 45-90 s of
the suite's time; `make demo` and bench/bench_operating_curve.py keep the 40.

Both versions are loaded before the traffic starts and the deploy moves the clients to v2, as a new
Deployment would take traffic: a model load in the one Triton would hold the requests in flight for
a second or so, and the clients' histogram (which sees queueing, unlike Triton's compute-time
counters) would rightly show that burst on v1."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from daemon.http.status import build_status
from daemon.storage.records import SignalRow
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.load import run_load
from lab.scenarios.clients import HISTOGRAM, ClientView
from lab.triton import load_version, served_versions
from tests.support.helpers import local_settings

pytestmark = pytest.mark.integration

POLICY = f"""
name: ranker-histogram
target:
  model: ranker
  triton: {{{{endpoints: ["{{url}}"]}}}}
triggers:
  - detector:
      type: tail_excess
      source: prometheus
      query: {HISTOGRAM}_bucket{{{{model="$model", le="500.0"}}}}
      companionQuery: {HISTOGRAM}_count{{{{model="$model"}}}}
      interval: 1s
      params: {{{{line: 500, evidence: histogram}}}}
actions:
  - type: triton.rollback
    to: previous
    requireAttribution: true
guards: {{{{cooldown: 10m}}}}
"""
LOAD_SECONDS = 170.0
RATE_PER_SECOND = 100.0
BASELINE_SECONDS = 25.0


async def test_the_histogram_names_the_bad_version_and_it_is_rolled_back(
        tmp_path: Path, triton_factory, prometheus_factory):
    triton = await triton_factory(name="ranker", slow_fraction_by_version={1: 0.0, 2: 0.005}, slow_ms=900,
                                  fast_ms=3, instances=4)
    await load_version(triton, "ranker", [1, 2])
    clients = ClientView("ranker", window_seconds=15)
    routed: dict[str, str | None] = {"version": "1"}
    await clients.start()
    try:
        prom = await prometheus_factory(scrape_targets={"clients": [clients.target]}, scrape_interval="1s")
        pol = tmp_path / "policies"
        pol.mkdir()
        (pol / "ranker.yaml").write_text(POLICY.format(url=triton.base_url))
        settings = local_settings(tmp_path, pol, prometheus={"url": prom.url, "timeoutSeconds": 5})
        async with Service(settings, action_registry(), detector_registry()) as svc:
            load = asyncio.ensure_future(run_load(triton.base_url, model="ranker", rate_per_second=RATE_PER_SECOND,
                                                  duration_seconds=LOAD_SECONDS, on_sample=clients.record,
                                                  route=lambda: routed["version"]))
            try:
                await _play(svc, routed)
            finally:
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
            status = build_status(await svc.status_inputs())
            decisions = await svc.journal.decisions.all.in_thread()
            signals = await svc.journal.signals.all.in_thread()
    finally:
        await clients.stop()
    _check(triton, status, decisions, signals)


async def _play(svc: Service, routed: dict[str, str | None]) -> None:
    """Baseline on v1, the deploy, and the wait for the decision."""
    await asyncio.sleep(BASELINE_SECONDS)
    assert await svc.journal.decisions.all.in_thread() == []
    routed["version"] = "2"  # the deploy: the clients move to v2
    deadline = asyncio.get_running_loop().time() + LOAD_SECONDS - BASELINE_SECONDS - 5
    while not await svc.journal.decisions.all.in_thread():
        assert asyncio.get_running_loop().time() < deadline, \
            [e.reason for e in await svc.journal.evaluations.all.in_thread()][-4:]
        await asyncio.sleep(0.5)
    routed["version"] = None  # after the rollback, whatever Triton serves
    await svc.drain()


def _check(triton: Any, status: dict[str, Any], decisions: list[Any], signals: list[SignalRow]) -> None:
    assert decisions[0].state == "succeeded", decisions[0].reason
    assert served_versions(triton, "ranker") == ["1"]
    (signal,) = [s.payload for s in signals][:1]
    details = signal["details"]
    assert signal["labels"]["version"] == "2" and details["version"] == "2"
    assert details["evidence"] == "histogram" and details["assumed"]["false_alarm_days"] == 30
    # `tailguard status` says what the test assumed, from the last cycle.
    (target,) = status["targets"]
    (detector,) = target["policies"][0]["detectors"]
    assert detector["detector"] == "tail_excess" and "one false alarm per 30 days" in detector["reason"]
    assert detector["assumed"]["false_alarm_days"] == 30 and detector["assumed"]["evidence"] == "histogram"
    assert detector["assumed"]["requests_per_second"] > 0 and len(detector["assumed"]["thresholds"]) == 6
    # Exact counts: the episode's share above the line is the defect's order, not a latency mass.
    assert 0.002 < details["episode_above_line"] / details["episode_requests"] < 0.05
