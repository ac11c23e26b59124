"""Issue evidence: history backfilled into a real Prometheus (promtool), the daemon forecasts from it
through the real query API and acts minutes before the breach; a flat series gives no signal.

The daemon's clock is set one hour back so the backfilled history (which promtool writes as past
blocks) ends at the daemon's "now"."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.prometheus import BackfillSeries, PrometheusServer, backfill_openmetrics
from lab.triton import TritonServer, served_versions
from tests.support.helpers import NotifySink, local_settings, wait_for

pytestmark = pytest.mark.integration

OFFSET_SECONDS = 3600.0
STEP = 15.0
METRIC = "model:triton_request_latency_seconds:p999"
THRESHOLD = 0.5
BREACH_IN_SECONDS = 300.0  # the ramp crosses the threshold 5 minutes after the daemon's "now"

POLICY = """
name: {model}-forecast
target:
  model: {model}
  triton: {{endpoints: ["{url}"]}}
triggers:
  - detector:
      type: forecast_breach
      query: {metric}{{model="$model"}}
      interval: 15s
      params: {{model: {forecaster}, threshold: {threshold}, horizon_seconds: 15m, lookback_seconds: 2h}}
actions:
  - type: {action}
"""


def _history(now: float, ramp: bool, seed: int) -> list[tuple[float, float]]:
    """3h of noisy ~200 ms, then (ramp) a climb that reaches 500 ms BREACH_IN_SECONDS after `now`."""
    rng = random.Random(seed)
    ramp_start = now - 1200.0
    slope = (THRESHOLD - 0.2) / (1200.0 + BREACH_IN_SECONDS)
    out = []
    t = now - 3 * 3600.0
    while t <= now:
        v = 0.2 + rng.gauss(0, 0.004)
        if ramp and t > ramp_start:
            v += slope * (t - ramp_start)
        out.append((t, v))
        t += STEP
    return out


async def _prometheus(tmp_path: Path, now: float, prometheus_factory) -> PrometheusServer:
    data = tmp_path / "tsdb"
    backfill_openmetrics(data, [
        BackfillSeries(METRIC, _history(now, ramp=True, seed=1), {"model": "ranker"}),
        BackfillSeries(METRIC, _history(now, ramp=False, seed=2), {"model": "scorer"}),
    ])
    return await prometheus_factory(scrape_targets={}, data_dir=data)


async def test_holt_forecast_rolls_back_before_the_breach(tmp_path: Path, prometheus_factory,
                                                          triton_server: TritonServer):
    """Holt path: the ramp's breach is predicted ~5 min ahead and ranker is rolled back; the flat
    scorer series produces no signal."""
    start_real = time.time()
    now0 = start_real - OFFSET_SECONDS
    prom = await _prometheus(tmp_path, now0, prometheus_factory)
    pol = tmp_path / "policies"
    pol.mkdir()
    for model in ("ranker", "scorer"):
        (pol / f"{model}.yaml").write_text(POLICY.format(
            model=model, url=triton_server.base_url, metric=METRIC, forecaster="holt",
            threshold=THRESHOLD, action="triton.rollback"))
    settings = local_settings(tmp_path, pol, prometheus={"url": prom.url})
    clock = lambda: time.time() - OFFSET_SECONDS  # noqa: E731
    async with Service(settings, action_registry(), detector_registry(), clock=clock) as svc:
        await wait_for(lambda: len(svc.journal.evaluations.all()) >= 2, timeout=30)
        await svc.drain()
        decisions = await svc.journal.decisions.all.in_thread()
        signals = await svc.journal.signals.all.in_thread()
        evaluations = {e["policy"]: e for e in await svc.journal.evaluations.all.in_thread()}
    (decision,) = decisions
    assert decision.policy == "ranker-forecast" and decision.state == "succeeded", decision.reason
    (signal,) = signals
    details = signal["payload"]["details"]
    assert details["lead_seconds"] >= 300 - 60, details  # at least ~5 minutes ahead
    assert details["probability"] >= details["min_probability"], details
    assert details["predicted_crossing_time"] > signal["payload"]["details"].get("episode_start", 0)
    assert served_versions(triton_server) == ["1"]
    assert not evaluations["scorer-forecast"]["fired"]


async def test_prophet_forecast_through_the_process_pool(tmp_path: Path, prometheus_factory):
    """Prophet path: the fit runs in the daemon's process pool, the cached forecast predicts the
    breach, and the policy's notify action fires once."""
    start_real = time.time()
    now0 = start_real - OFFSET_SECONDS
    prom = await _prometheus(tmp_path, now0, prometheus_factory)
    async with NotifySink() as sink:
        pol = tmp_path / "policies"
        pol.mkdir()
        (pol / "ranker.yaml").write_text(
            POLICY.format(model="ranker", url="http://127.0.0.1:9", metric=METRIC, forecaster="prophet",
                          threshold=THRESHOLD, action="notify").replace(
                "  - type: notify\n", f"  - type: notify\n    url: {sink.url}\n"))
        settings = local_settings(tmp_path, pol, prometheus={"url": prom.url})
        async with Service(settings, action_registry(), detector_registry(),
                           clock=lambda: time.time() - OFFSET_SECONDS) as svc:
            await wait_for(lambda: len(sink.received) == 1, timeout=120)
            await svc.drain()
            (signal,) = await svc.journal.signals.all.in_thread()
        details = signal["payload"]["details"]
        assert signal["payload"]["name"] == "forecast_breach"
        assert details["lead_seconds"] > 0
        assert sink.received[0]["signal"]["labels"]["model"] == "ranker"
