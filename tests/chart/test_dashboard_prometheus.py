"""Every query of the chart's rendered dashboard (panels and annotations) evaluated against a real
Prometheus: the tail radar answers one series per version for each of P90..P99.99, the detector
panel its statistic and threshold. Prometheus scrapes real Triton (two versions of one model served
side by side, started with the quantiles docs/helm.md recommends, 0.9999 included, and sent requests
on each version) for the latency series, and a loopback exporter for the daemon's detector, action
and decision series (a daemon that has acted is another test's business: these only need to exist).
With a few hundred requests Triton's P99.99 is the slowest request or two, not a percentile: the
test checks that the panel's query answers per version, not what it says."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from daemon.sources.prometheus import PrometheusClient
from lab.load import run_load
from lab.triton import load_version
from tests.support import helm_render as hr
from tests.support.kube_helpers import GaugeExporter

pytestmark = pytest.mark.integration

QUANTILES = ("0.9", "0.95", "0.99", "0.999", "0.9999")


def _dashboard() -> dict[str, Any]:
    objects = hr.render({"dashboard": {"enabled": True}})
    cm = hr.one(objects, "ConfigMap", f"{hr.RELEASE}-tailguard-dashboard")
    return json.loads(cm["data"]["tailguard-tail-latency.json"])  # type: ignore[no-any-return]


def _daemon_series(exporter: GaugeExporter) -> None:
    base = 'policy="ranker-tail",trigger="0",detector="tail_excess",series="model=ranker,version=2"'
    exporter.values[f"tailguard_detector_score{{{base}}}"] = 32.1
    exporter.values[f"tailguard_detector_threshold{{{base}}}"] = 29.1
    exporter.values['tailguard_actions_total{action="triton.rollback",result="succeeded"}'] = 1.0
    exporter.values['tailguard_decisions_total{policy="ranker-tail",state="succeeded"}'] = 1.0
    exporter.values["tailguard_prometheus_up"] = 1.0
    exporter.values["tailguard_is_leader"] = 1.0


async def test_every_dashboard_query_answers_per_version_from_real_prometheus(
        prometheus_factory: Any, triton_factory: Any) -> None:
    dash = _dashboard()
    triton = await triton_factory(name="ranker", slow_fraction_by_version={1: 0.0, 2: 0.02}, slow_ms=50)
    await load_version(triton, "ranker", [1, 2])
    async with GaugeExporter() as exporter:
        _daemon_series(exporter)
        prom = await prometheus_factory(scrape_targets={"triton": [triton.metrics_target], "tailguard": [exporter.target]},
                                        scrape_interval="1s")
        client = PrometheusClient(prom.url)
        try:
            versions = iter(["1", "2"] * 200)  # each version's summaries need requests of their own
            await run_load(triton.base_url, "ranker", rate_per_second=100.0, duration_seconds=4.0,
                           route=lambda: next(versions))
            for _ in range(60):  # Prometheus 2.42 does not scrape during its first ~5 s
                up = await client.query('count(nv_inference_request_summary_us{quantile="0.9999"}) >= 2 '
                                        'and on() tailguard_is_leader')
                if up.ok and up.samples:
                    break
                await asyncio.sleep(0.5)
            # Counters need two samples for increase(): one more scrape, then a second value.
            await asyncio.sleep(2.0)
            exporter.values['tailguard_actions_total{action="triton.rollback",result="succeeded"}'] = 2.0
            exporter.values['tailguard_decisions_total{policy="ranker-tail",state="succeeded"}'] = 2.0
            await asyncio.sleep(3.0)
            answered: dict[str, list[dict[str, str]]] = {}
            exprs = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
            exprs += [(a["name"], a["expr"]) for a in dash["annotations"]["list"]]
            for title, expr in exprs:
                filled = expr.replace("$__rate_interval", "1m").replace("$model", "ranker")
                result = await client.query_range(filled, time.time() - 30, time.time(), 1.0)
                assert result.error is None, (title, filled, result.error)
                assert result.series, (title, filled)
                answered[filled] = [dict(s.labels) for s in result.series]
        finally:
            client.close()
    radar = [e for e in answered if "nv_inference_request_summary_us" in e and "by (model, version)" in e]
    assert len(radar) == len(QUANTILES)
    for expr in radar:
        assert sorted(labels["version"] for labels in answered[expr]) == ["1", "2"], expr

