"""Backtesting examples/policies/ranker.yaml (only its endpoints filled in) over history in a real
Prometheus: its `source: triton` tail_excess trigger is replayed through the counters as Prometheus
stored them (on the 5 s scrape interval, said in a note), its alert trigger from the `ALERTS` series,
and the rollback is the one plan. History is written with promtool: Triton's counters per version
(v1 healthy, then v2 with 0.5% of requests at 900 ms) and the rule's `ALERTS` samples."""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from daemon.wiring.backtest import backtest, text_lines
from daemon.wiring.registries import action_registry, detector_registry
from lab.prometheus import BackfillSeries, backfill_openmetrics
from policies.loader import load_policies
from tests.support.helpers import example_backtest_settings
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "policies" / "ranker.yaml"
SCRAPE = 5.0
RATE = 40.0  # requests per second
FAST_US, SLOW_US = 5_000.0, 900_000.0
STORED = {"instance": "127.0.0.1:8002", "job": "triton", "model": "ranker"}


def _counters(start: float, deploy: float, end: float) -> list[BackfillSeries]:
    """Cumulative compute time and successes per version, one sample per scrape: v1 until the
    deploy, v2 after it, each v2 request taking the slow path with chance 0.5%."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    totals = {"1": [0.0, 0.0], "2": [0.0, 0.0]}
    rng = random.Random(7)
    t = start
    while t <= end:
        version = "1" if t < deploy else "2"
        for _ in range(int(RATE * SCRAPE)):
            slow = version == "2" and rng.random() < 0.005
            totals[version][0] += SLOW_US if slow else rng.uniform(0.6, 1.4) * FAST_US
            totals[version][1] += 1
        for v, (duration, count) in totals.items():
            if v == "2" and t < deploy:
                continue
            series.setdefault(("nv_inference_compute_infer_duration_us", v), []).append((t, duration))
            series.setdefault(("nv_inference_request_success", v), []).append((t, count))
        t += SCRAPE
    return [BackfillSeries(name, samples, {**STORED, "version": v}) for (name, v), samples in series.items()]


def _alerts(since: float, end: float) -> BackfillSeries:
    samples = [(since + k * SCRAPE, 1.0) for k in range(int((end - since) / SCRAPE) + 1)]
    return BackfillSeries("ALERTS", samples, {"alertname": "TritonTailLatencyHigh", "alertstate": "firing",
                                              "model": "ranker", "severity": "page"})


async def test_backtest_replays_the_examples_detector_and_alert_and_shows_the_rollback(
        tmp_path: Path, prometheus_factory: Any) -> None:
    end = time.time() - 3600.0  # promtool writes past blocks
    deploy = end - 600.0
    data = tmp_path / "tsdb"
    backfill_openmetrics(data, [*_counters(end - 3600.0, deploy, end), _alerts(deploy + 120.0, end)])
    prom = await prometheus_factory(scrape_targets={}, data_dir=data)

    settings = example_backtest_settings(tmp_path, EXAMPLE.name, prom.url)
    policies = load_policies(Path(settings.policies.path), action_registry(), detector_registry())
    result = await backtest(settings, policies, detector_registry(), deploy - 300.0, deploy + 300.0)
    lines = text_lines(result)

    names = [f.signal.name for f in result.fired]
    print("\n".join(lines))
    assert "tail_excess" in names and "TritonTailLatencyHigh" in names, lines
    (plan,) = result.plans
    assert plan.signal.name == "tail_excess" and plan.decision.actions.startswith("triton.rollback(to=previous")
    # The start test decides (slow requests counted per 5 s step). At 0.5% of 200 requests a step,
    # most steps hold one, and counting waits for ten quiet steps to know the bulk's noise (about
    # two minutes); the running bank alone takes about four. Inside the 5-minute replay either way.
    assert deploy <= plan.at < deploy + 300.0, (plan.at - deploy, lines)
    assert "start test:" in str(plan.signal.details.get("reason", "")), lines
    (alert,) = [f for f in result.fired if f.signal.name == "TritonTailLatencyHigh"]
    # The alert is governed (policies/governance.py): after the detector's rollback the cooldown says
    # no first; before it, the detector sees the target and the alert only notifies.
    why = "cooldown" if alert.at >= plan.at else "notify only: the governing detector (trigger 0) judged fresh"
    assert alert.decision.outcome == "blocked" and alert.decision.reason.startswith(why), lines
    notes = "\n".join(result.notes)
    assert "one step per scrape interval (5 s)" in notes and "from ALERTS{" in notes, notes


async def test_a_short_replay_from_the_first_scrapes_reads_the_scrape_interval_inside_the_range(
        tmp_path: Path, prometheus_factory: Any) -> None:
    """A replay of under a minute that starts before Prometheus' first scrape of Triton (a short demo
    run backtested from 20 s before its deploy) still finds the counters it stored in the range."""
    end = time.time() - 3600.0
    deploy = end - 30.0
    data = tmp_path / "tsdb"
    backfill_openmetrics(data, _counters(deploy - 10.0, deploy, end))
    prom = await prometheus_factory(scrape_targets={}, data_dir=data)
    settings = example_backtest_settings(tmp_path, EXAMPLE.name, prom.url)
    result = await backtest(settings, load_policies(Path(settings.policies.path), action_registry(), detector_registry()),
                            detector_registry(), deploy - 20.0, end)
    notes = "\n".join(result.notes)
    assert "one step per scrape interval (5 s)" in notes, notes
