"""The governed alert on real Prometheus (issue #40): the lab's client histogram at 4 req/s and a
`histogram_quantile` P99.9 alert beside the tail_excess detector, replayed by `tailguard backtest`
(the poller's own detection path over Prometheus' history, the alert from its `ALERTS` series, each
alert ruled by `policies.governance.rule` as live).

- A healthy version whose two slow requests in five minutes fire the alert: the detector sees the
  target, so the alert only notifies; nothing is rolled back.
- A breach the detector cannot see (the histogram's series end: the exporter is gone) while the
  alert fires: once the evidence has been missing for longer than `backstopAfter` the alert rolls
  back as the backstop; before that it notifies.

History is written with promtool (a live rule engine cannot be made to evaluate the past): the
histogram per scrape, and `ALERTS` samples where the rule's expression, evaluated by this Prometheus
over that histogram, is above 500 ms (checked in the test)."""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from daemon.wiring.backtest import backtest, text_lines
from daemon.wiring.registries import action_registry, detector_registry
from lab.prometheus import BackfillSeries, backfill_openmetrics
from lab.scenarios.clients import BUCKETS_MS, HISTOGRAM
from policies.loader import load_policies
from tests.support.helpers import local_settings

pytestmark = pytest.mark.integration

SCRAPE = 5.0
RATE = 4.0  # requests per second
LABELS = {"instance": "127.0.0.1:9464", "job": "clients", "model": "ranker", "version": "1"}
RULE = f'histogram_quantile(0.999, sum by (le, model) (rate({HISTOGRAM}_bucket{{model="ranker"}}[1m]))) > 500'
POLICY = f"""
name: ranker-tail
target: {{model: ranker, triton: {{endpoints: ["http://127.0.0.1:9"]}}}}
triggers:
  - detector:
      type: tail_excess
      query: {HISTOGRAM}_bucket{{model="$model", le="500.0"}}
      companionQuery: {HISTOGRAM}_count{{model="$model"}}
      interval: 5s
      params: {{line: 500, line_unit: ms, evidence: histogram}}
  - alert: {{name: TritonTailLatencyHigh, matchers: {{severity: page}}}}
actions:
  - {{type: triton.rollback, to: previous}}
guards: {{cooldown: 10m}}
verify: {{query: 'vector(0)', below: 1}}
"""

ALERT_ONLY = """
name: ranker-alone
target: {model: ranker, triton: {endpoints: ["http://127.0.0.1:9"]}}
triggers:
  - alert: {name: TritonTailLatencyHigh}
actions:
  - {type: triton.rollback, to: previous}
verify: {query: 'vector(0)', below: 1}
"""


def _histogram(start: float, end: float, slow_at: list[float], seed: int) -> list[BackfillSeries]:
    """The clients' cumulative histogram of v1, one sample per scrape from `start` to `end`: RATE
    requests a second of 3-30 ms, and one of 900 ms at each moment in `slow_at`."""
    rng = random.Random(seed)
    bounds = [*BUCKETS_MS, float("inf")]
    counts = [0] * len(bounds)
    total, samples = 0.0, {b: [] for b in bounds}  # type: dict[float, list[tuple[float, float]]]
    sums: list[tuple[float, float]] = []
    pending = sorted(slow_at)
    t = start
    while t <= end:
        latencies = [rng.uniform(3.0, 30.0) for _ in range(int(RATE * SCRAPE))]
        while pending and pending[0] <= t:
            latencies.append(900.0)
            pending.pop(0)
        for ms in latencies:
            total += ms
            for i, bound in enumerate(bounds):
                if ms <= bound:
                    counts[i] += 1
        for i, bound in enumerate(bounds):
            samples[bound].append((t, float(counts[i])))
        sums.append((t, total))
        t += SCRAPE
    out = [BackfillSeries(f"{HISTOGRAM}_bucket", samples[b], {**LABELS, "le": "+Inf" if b == float("inf") else f"{b:.1f}"})
           for b in bounds]
    out.append(BackfillSeries(f"{HISTOGRAM}_count", samples[bounds[-1]], LABELS))
    out.append(BackfillSeries(f"{HISTOGRAM}_sum", sums, LABELS))
    return out


def _alerts(moments: list[float]) -> BackfillSeries:
    return BackfillSeries("ALERTS", [(t, 1.0) for t in moments],
                          {"alertname": "TritonTailLatencyHigh", "alertstate": "firing", "model": "ranker",
                           "severity": "page"})


async def _rule_fires_at(prom_url: str, at: float) -> bool:
    """Whether the alert's expression, evaluated by this Prometheus at `at`, is above 500 ms."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{prom_url}/api/v1/query", params={"query": RULE, "time": str(at)}) as response:
            body: dict[str, Any] = await response.json()
    return bool(body["data"]["result"])


async def _replay(tmp_path: Path, prometheus_factory: Any, series: list[BackfillSeries], start: float,
                  end: float) -> Any:
    data = tmp_path / "tsdb"
    backfill_openmetrics(data, series)
    prom = await prometheus_factory(scrape_targets={}, data_dir=data)
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "ranker.yaml").write_text(POLICY)
    settings = local_settings(tmp_path, pol, prometheus={"url": prom.url})
    policies = load_policies(pol, action_registry(), detector_registry())
    return prom, await backtest(settings, policies, detector_registry(), start, end)


async def test_two_slow_requests_fire_the_alert_and_a_healthy_version_is_not_rolled_back(
        tmp_path: Path, prometheus_factory: Any) -> None:
    end = time.time() - 3600.0  # promtool writes past blocks
    begin = end - 1800.0
    slow = [end - 600.0, end - 420.0]  # two slow requests in five minutes
    firing = [t for t in (end - 600.0 + k * SCRAPE for k in range(int(300 / SCRAPE))) if any(0 <= t - s < 60 for s in slow)]
    prom, result = await _replay(tmp_path, prometheus_factory, [*_histogram(begin, end, slow, 1), _alerts(firing)],
                                 end - 900.0, end)
    lines = text_lines(result)
    assert await _rule_fires_at(prom.url, slow[0] + 20.0) and not await _rule_fires_at(prom.url, slow[0] - 30.0)
    assert result.plans == [], lines
    alerts = [f for f in result.fired if f.signal.name == "TritonTailLatencyHigh"]
    assert alerts, lines  # backfilled samples carry no staleness marker: the two firings may read as one onset
    for fired in alerts:
        assert fired.decision.outcome == "blocked", lines
        assert fired.decision.reason.startswith("notify only: the governing detector (trigger 0) judged fresh"), lines
    assert not [f for f in result.fired if f.signal.name == "tail_excess"], lines


async def test_a_breach_the_detector_cannot_see_is_rolled_back_by_the_backstop(
        tmp_path: Path, prometheus_factory: Any) -> None:
    end = time.time() - 3600.0
    begin = end - 1800.0
    # The histogram's series end: backfilled samples carry no staleness marker, so Prometheus answers
    # the last one for its 5-minute lookback delta (a scraped target that vanishes is marked stale at
    # once); the detector's evidence goes missing from then.
    gone = end - 1000.0
    early = [gone + 60.0 + k * SCRAPE for k in range(4)]  # fires a minute after: the detector still sees
    late = [gone + 720.0 + k * SCRAPE for k in range(int(200 / SCRAPE))]  # 7 minutes blind: the backstop
    prom, result = await _replay(tmp_path, prometheus_factory, [*_histogram(begin, gone, [], 2), _alerts(early + late)],
                                 gone - 200.0, end)
    lines = text_lines(result)
    first, second = [f for f in result.fired if f.signal.name == "TritonTailLatencyHigh"]
    assert first.decision.outcome == "blocked" and first.decision.reason.startswith("notify only"), lines
    (plan,) = result.plans or [None]
    assert plan is not None, "\n".join(lines)
    assert plan is second and plan.decision.actions.startswith("triton.rollback(to=previous"), lines
    assert second.decision.reason.startswith("backstop: no fresh evidence from the governing detector (trigger 0)")
    assert second.at - (gone + 300.0) > 300.0


async def test_the_daemon_journals_a_governed_alert_as_notify_only_and_counts_it(tmp_path: Path) -> None:
    """The live ladder: an alert on the rollback policy, the daemon just started and no poller (no
    prometheus.url): a start's first minutes are not missing evidence, so the alert is journaled
    notify-only with the ruling in its plan, nothing is observed or rolled back (the Triton URL is
    unreachable), and the ruling is counted; an alert-only rollback policy beside it cannot keep its
    promise and also only notifies."""
    from daemon.wiring.service import Service
    from tests.support.helpers import post_alerts, sample_payload

    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "ranker.yaml").write_text(POLICY)
    (pol / "alone.yaml").write_text(ALERT_ONLY)
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        assert (await post_alerts(svc, sample_payload())).status == 200
        await svc.drain()
        decisions = {d.policy: d for d in await svc.journal.decisions.all.in_thread()}
        metrics = svc.metrics.governed_alerts
        assert metrics.labels("ranker-tail", "notify")._value.get() == 1.0
        assert metrics.labels("ranker-alone", "notify")._value.get() == 1.0
    governed, alone = decisions["ranker-tail"], decisions["ranker-alone"]
    assert governed.state == "blocked" and governed.reason.startswith("notify only: started "), governed.reason
    assert governed.plan["governance"]["standing"] == "governed" and governed.plan["steps"] == []
    assert alone.state == "blocked" and "no detector trigger of the policy governs this alert" in alone.reason
    assert alone.plan["governance"]["standing"] == "notify_only"
