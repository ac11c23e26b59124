"""gateway.retune_timeout end to end: a real Prometheus scrapes a gauge the test controls, a real
Service retunes an Istio route in the emulator on an alert, records an Event, and leaves the
timeout alone when the model has no P99.9 data."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from daemon.sources.prometheus import PrometheusClient
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import local_settings, payload_with, post_alerts, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from lab.kube.emulator import KubeEmulator
from tests.support.kube_helpers import GaugeExporter, kube_settings, virtual_service, write_kubeconfig

pytestmark = pytest.mark.integration

POLICY = """
name: {model}-retune
target:
  model: {model}
  namespace: serving
  triton: {{service: {{namespace: serving, name: {model}-triton}}}}
triggers:
  - alert: {{name: TritonTailLatencyHigh}}
actions:
  - type: gateway.retune_timeout
    query: 'max(tail_p999_seconds{{model="$model"}})'
    floorMs: 2000
    factor: 1.5
    maxMs: 30000
    sink: {{kind: istio, namespace: serving, name: {model}, route: primary}}
guards: {{cooldown: 0s}}
# alert-only: a verify block is required; its outcome is irrelevant here (onNotRecovered: none)
verify: {{query: 'vector(0)', below: 1, onNotRecovered: none}}
"""


async def test_retune_from_real_prometheus_and_no_data_means_no_change(
        tmp_path: Path, kube_emulator: KubeEmulator, prometheus_factory: Any) -> None:  # noqa: F811
    """P99.9 4 s scraped by Prometheus -> route timeout 2s becomes 6s, a Normal Event names the
    change; a model without series keeps its timeout and its decision says why."""
    kube_emulator.seed(virtual_service("ranker", timeout="2s"))
    kube_emulator.seed(virtual_service("scorer", timeout="2s"))
    async with GaugeExporter() as exporter:
        exporter.values['tail_p999_seconds{model="ranker"}'] = 4.0
        prom = await prometheus_factory(scrape_targets={"exporter": [exporter.target]}, scrape_interval="1s")
        client = PrometheusClient(prom.url)
        try:
            ready = {"v": False}

            async def scraped() -> None:
                result = await client.query('tail_p999_seconds{model="ranker"}')
                ready["v"] = result.ok

            for _ in range(60):  # Prometheus 2.42 does not scrape during its first ~5 s
                await scraped()
                if ready["v"]:
                    break
                await asyncio.sleep(0.5)
            assert ready["v"], prom.log_tail()
        finally:
            client.close()

        pol = tmp_path / "policies"
        pol.mkdir()
        for model in ("ranker", "scorer"):
            (pol / f"{model}.yaml").write_text(POLICY.format(model=model))
        settings = local_settings(tmp_path, pol, prometheus={"url": prom.url},
                                  kubernetes=kube_settings(write_kubeconfig(tmp_path / "kc", kube_emulator)))
        async with Service(settings, action_registry(), detector_registry()) as svc:
            assert (await post_alerts(svc, payload_with(model="ranker"))).status == 200
            assert (await post_alerts(svc, payload_with(model="scorer", fingerprint="f00d"))).status == 200
            await svc.drain()
            decisions = {d.policy: d for d in await svc.journal.decisions.all.in_thread()}
            assert decisions["ranker-retune"].state == "succeeded", decisions["ranker-retune"].reason
            (step,) = decisions["ranker-retune"].plan["steps"]
            assert step["after"]["raw"] == "6s" and step["before"]["timeout"]["raw"] == "2s"
            assert 'max(tail_p999_seconds{model="ranker"})' in step["before"]["query"]
            assert kube_emulator.get("virtualservices", "serving", "ranker")["spec"]["http"][0]["timeout"] == "6s"

            scorer = decisions["scorer-retune"]
            assert scorer.state == "noop" and "no P99.9 data" in scorer.plan["steps"][0]["summary"]
            assert kube_emulator.get("virtualservices", "serving", "scorer")["spec"]["http"][0]["timeout"] == "2s"

            # The step's Event, and one per decision: the retune succeeded, the scorer's was a noop.
            reasons = lambda: {e["reason"] for e in kube_emulator.objects("events", "serving")}  # noqa: E731
            await wait_for(lambda: {"Remediated", "RemediationSucceeded", "RemediationNoop"} <= reasons(), timeout=10)
            (event,) = [e for e in kube_emulator.objects("events", "serving") if e["reason"] == "Remediated"]
            assert event["involvedObject"]["name"] == "ranker-triton"
            assert "2s -> 6s" in event["message"]
