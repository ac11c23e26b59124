"""examples/policies/retune.yaml as shipped (only the Kubernetes API emulated): its schedule's first
tick reads live P99.9 from a real Prometheus and sets the lab's Istio route timeout to
max(2000 ms, P99.9 x 1.5); a P99.9 below the floor leaves the floor."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from daemon.sources.prometheus import PrometheusClient
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.kube.emulator import KubeEmulator
from tests.support.helpers import local_settings, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from tests.support.kube_helpers import GaugeExporter, kube_settings, virtual_service, write_kubeconfig
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "policies" / "retune.yaml"
SERIES = 'nv_inference_request_summary_us{model="ranker",quantile="0.999"}'


async def _scraped(prom_url: str) -> None:
    client = PrometheusClient(prom_url)
    try:
        for _ in range(60):  # Prometheus 2.42 does not scrape during its first ~5 s
            if (await client.query(SERIES)).ok:
                return
            await asyncio.sleep(0.5)
        raise AssertionError("Prometheus never scraped the exporter")
    finally:
        client.close()


@pytest.mark.parametrize(("p999_us", "expected"), [(3_000_000.0, "4500ms"), (900_000.0, "2s")])
async def test_retune_example_sets_the_route_timeout_from_live_p999(
        tmp_path: Path, kube_emulator: KubeEmulator, prometheus_factory: Any,  # noqa: F811
        p999_us: float, expected: str) -> None:
    kube_emulator.seed(virtual_service("ranker", timeout="10s"))
    async with GaugeExporter() as exporter:
        exporter.values[SERIES] = p999_us
        prom = await prometheus_factory(scrape_targets={"triton": [exporter.target]}, scrape_interval="1s")
        await _scraped(prom.url)
        pol = tmp_path / "policies"
        pol.mkdir()
        (pol / "retune.yaml").write_text(EXAMPLE.read_text())  # unchanged
        settings = local_settings(tmp_path, pol, prometheus={"url": prom.url},
                                  kubernetes=kube_settings(write_kubeconfig(tmp_path / "kc", kube_emulator)))
        async with Service(settings, action_registry(), detector_registry()) as svc:
            await wait_for(lambda: bool(svc.journal.decisions.all()), timeout=30)
            await svc.drain()
            (decision,) = await svc.journal.decisions.all.in_thread()
            assert decision.policy == "ranker-retune" and decision.state == "succeeded", decision.reason
    route = kube_emulator.get("virtualservices", "serving", "ranker")["spec"]["http"][0]
    assert route["timeout"] == expected
