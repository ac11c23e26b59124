"""Issue evidence: history backfilled into a real Prometheus (promtool), the daemon forecasts from it
through the real query API and acts minutes before the breach; a flat series gives no signal.

The daemon's clock is set one hour back so the backfilled history (which promtool writes as past
blocks) ends at the daemon's "now": its clock reads the history's end at the moment the service
starts, however long promtool and Prometheus took (on a loaded machine the history otherwise ends
seconds before the first poll, and the stale repeats of its last sample flatten the forecast)."""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
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


def _grid(end: float) -> list[float]:
    """3h of scrape times on STEP ending exactly at `end` (a float sum drops the last one at random)."""
    steps = int(3 * 3600.0 / STEP)
    return [end - (steps - k) * STEP for k in range(steps + 1)]


def _history(now: float, ramp: bool, seed: int) -> list[tuple[float, float]]:
    """3h of noisy ~200 ms, then (ramp) a climb that reaches 500 ms BREACH_IN_SECONDS after `now`."""
    rng = random.Random(seed)
    ramp_start = now - 1200.0
    slope = (THRESHOLD - 0.2) / (1200.0 + BREACH_IN_SECONDS)
    out = []
    for t in _grid(now):
        v = 0.2 + rng.gauss(0, 0.004)
        if ramp and t > ramp_start:
            v += slope * (t - ramp_start)
        out.append((t, v))
    return out


def _clock_from(history_end: float) -> Callable[[], float]:
    """A clock that reads `history_end` now and runs on at real speed from there."""
    offset = time.time() - history_end
    return lambda: time.time() - offset


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
    now0 = time.time() - OFFSET_SECONDS
    prom = await _prometheus(tmp_path, now0, prometheus_factory)
    pol = tmp_path / "policies"
    pol.mkdir()
    for model in ("ranker", "scorer"):
        (pol / f"{model}.yaml").write_text(POLICY.format(
            model=model, url=triton_server.base_url, metric=METRIC, forecaster="holt",
            threshold=THRESHOLD, action="triton.rollback"))
    settings = local_settings(tmp_path, pol, prometheus={"url": prom.url})
    async with Service(settings, action_registry(), detector_registry(), clock=_clock_from(now0)) as svc:
        await wait_for(lambda: len(svc.journal.evaluations.all()) >= 2, timeout=30)
        await svc.drain()
        decisions = await svc.journal.decisions.all.in_thread()
        signals = await svc.journal.signals.all.in_thread()
        evaluations = {e.policy: e for e in await svc.journal.evaluations.all.in_thread()}
    (decision,) = decisions
    assert decision.policy == "ranker-forecast" and decision.state == "succeeded", decision.reason
    (signal,) = signals
    details = signal.payload["details"]
    assert details["lead_seconds"] >= 300 - 60, details  # at least ~5 minutes ahead
    assert details["probability"] >= details["min_probability"], details
    assert details["predicted_crossing_time"] > signal.payload["details"].get("episode_start", 0)
    assert served_versions(triton_server) == ["1"]
    assert not evaluations["scorer-forecast"].fired


async def test_prophet_forecast_through_the_process_pool(tmp_path: Path, prometheus_factory):
    """Prophet path: the fit runs in the daemon's process pool, the cached forecast predicts the
    breach, and the policy's notify action fires once."""
    now0 = time.time() - OFFSET_SECONDS
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
                           clock=_clock_from(now0)) as svc:
            await wait_for(lambda: len(sink.received) == 1, timeout=120)
            await svc.drain()
            (signal,) = await svc.journal.signals.all.in_thread()
        details = signal.payload["details"]
        assert signal.payload["name"] == "forecast_breach"
        assert details["lead_seconds"] > 0
        assert sink.received[0]["signal"]["labels"]["model"] == "ranker"


KNEE_POLICY = """
name: {model}-knee
target:
  model: {model}
triggers:
  - detector:
      type: forecast_breach
      query: nv_inference_request_summary_us{{model="$model", quantile="0.999"}}
      companionQuery: sum by (model) (rate(nv_inference_request_success{{model="$model"}}[1m]))
      interval: 15s
      params: {{threshold: 500000, horizon_seconds: 15m, lookback_seconds: 3h}}
actions:
  - type: notify
    url: {url}
"""


def _knee_history(now: float, seed: int, grows: bool) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """3h at half of a 200 req/s capacity (the load wobbling 2% per scrape and 5% over an hour),
    then (grows) the request rate grows 1% a minute from 37 minutes before `now`: the P99.9 in
    microseconds ``100 ms / (1 - load)`` with 5% noise crosses 500 ms 5-10 minutes after `now`.
    Returns the summary's samples and the success counter's (cumulative)."""
    rng = random.Random(seed)
    latency, counter = [], []
    total = 0.0
    for t in _grid(now):
        growth = 1.01 ** (max(t - (now - 37 * 60.0), 0.0) / 60.0) if grows else 1.0
        load = min(0.5 * growth * (1 + 0.05 * math.sin(2 * math.pi * (t - now) / 3600.0))
                   * math.exp(rng.gauss(0, 0.02)), 0.99)
        if grows:
            latency.append((t, 100_000.0 / (1.0 - load) * math.exp(rng.gauss(0, 0.05))))
        else:  # traffic that grows far from any knee: the latency does not move
            latency.append((t, 200_000.0 * math.exp(rng.gauss(0, 0.05))))
        total += load * 200.0 * STEP
        counter.append((t, total))
    return latency, counter


async def test_a_load_nearing_capacity_is_forecast_through_the_request_rate(tmp_path: Path, prometheus_factory):
    """The capacity knee end to end: the request rate (a success counter's rate, the trigger's
    companionQuery) and Triton's summary P99.9 backfilled into a real Prometheus; the daemon reads
    both through range queries, fits the knee, and acts minutes before the breach, its signal saying
    the capacity it fitted; traffic that grows without moving the latency gives nothing."""
    now0 = time.time() - OFFSET_SECONDS
    series = []
    for model, seed, grows in (("ranker", 1, True), ("scorer", 2, False)):
        latency, counter = _knee_history(now0, seed, grows)
        series += [BackfillSeries("nv_inference_request_summary_us", latency, {"model": model, "quantile": "0.999"}),
                   BackfillSeries("nv_inference_request_success", counter, {"model": model, "version": "1"})]
    data = tmp_path / "tsdb"
    backfill_openmetrics(data, series)
    prom = await prometheus_factory(scrape_targets={}, data_dir=data)
    async with NotifySink() as sink:
        pol = tmp_path / "policies"
        pol.mkdir()
        for model in ("ranker", "scorer"):
            (pol / f"{model}.yaml").write_text(KNEE_POLICY.format(model=model, url=sink.url))
        settings = local_settings(tmp_path, pol, prometheus={"url": prom.url})
        async with Service(settings, action_registry(), detector_registry(),
                           clock=_clock_from(now0)) as svc:
            await wait_for(lambda: len(sink.received) == 1, timeout=60)
            await wait_for(lambda: {e.policy for e in svc.journal.evaluations.all()} >= {"ranker-knee",
                                                                                            "scorer-knee"},
                           timeout=30)
            await svc.drain()
            (signal,) = await svc.journal.signals.all.in_thread()
            evaluations = {e.policy: e for e in await svc.journal.evaluations.all.in_thread()}
    details = signal.payload["details"]
    assert signal.policy == "ranker-knee"
    assert details["knee"]["used"] is True and 150.0 < details["knee"]["capacity_rate"] < 250.0, details["knee"]
    assert details["lead_seconds"] >= 180, details
    assert sink.received[0]["signal"]["labels"]["model"] == "ranker"
    assert not evaluations["scorer-knee"].fired
