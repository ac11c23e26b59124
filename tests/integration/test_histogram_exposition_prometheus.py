"""The example histogram policies' queries through real Prometheus (2.42, as the rest of the suite):
the expositions of fixtures/exposition (Triton's first-response histogram as 26.01 writes it, an
Istio sidecar's request duration) served on loopback with counts that grow every second, scraped
every second; the live detector on Prometheus' range answers fires on the version with slow
requests and not on the healthy one. And the `le` fact of docs/stack-facts.md: Prometheus 2 keeps
the bound as exposed (`le="500"`), so `le="500.0"` selects nothing."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from daemon.sources.prometheus import PrometheusClient
from detectors.sequential.thresholds import STORE
from detectors.tail_excess import TailExcessDetector, TailExcessParams
from tests.support.exposition import cumulative, rewrite
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

EXPOSITION = REPO / "fixtures" / "exposition"
TRITON = "nv_inference_first_response_histogram_ms"
ISTIO = "istio_request_duration_milliseconds"
TRITON_BOUNDS = ["100", "500", "2000", "5000", "+Inf"]
ISTIO_BOUNDS = ["0.5", "1", "5", "10", "25", "50", "100", "250", "500", "1000", "2500", "5000", "10000", "30000",
                "60000", "300000", "600000", "1800000", "3600000", "+Inf"]
SECONDS = 25


class Exporter:
    """Both expositions on one loopback /metrics, 40 requests a second per version added each second
    (v2: 5% of them slow), the counts rewritten into the exporters' own lines."""

    def __init__(self) -> None:
        self.triton = (EXPOSITION / "triton_first_response_histogram.txt").read_text()
        self.istio = (EXPOSITION / "istio_request_duration.txt").read_text()
        self.rng = np.random.default_rng(3)
        self.counts = {v: [0, 0] for v in ("1", "2")}  # fast, slow
        self.text = self._render()
        self._runner: web.AppRunner | None = None
        self.target = ""

    def _render(self) -> str:
        triton = {v: cumulative(TRITON_BOUNDS, f, s, 900.0, f + s) for v, (f, s) in self.counts.items()}
        istio = {f"v{v}": cumulative(ISTIO_BOUNDS, f, s, 900.0, f + s) for v, (f, s) in self.counts.items()}
        return rewrite(self.triton, TRITON, "version", triton) + rewrite(self.istio, ISTIO, "destination_version", istio)

    def tick(self) -> None:
        for v, share in (("1", 0.0), ("2", 0.05)):
            slow = int(self.rng.binomial(40, share))
            self.counts[v][0] += 40 - slow
            self.counts[v][1] += slow
        self.text = self._render()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.target = f"127.0.0.1:{self._runner.addresses[0][1]}"

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.text, content_type="text/plain")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def _decide(params: TailExcessParams, buckets: Any, counts: Any, label: str, now: float) -> dict[str, Any]:
    by = {s.labels[label]: s for s in counts.series}
    series = sorted(buckets.series, key=lambda s: s.labels[label])
    pairs = [by.get(s.labels[label]) for s in series]
    det = TailExcessDetector(params)
    det.detect_many(series, now, pairs)
    assert STORE.wait()
    return {s.labels[label]: d for s, d in zip(series, det.detect_many(series, now, pairs))}


async def test_the_example_histograms_through_real_prometheus(prometheus_factory: Any) -> None:
    exporter = Exporter()
    await exporter.start()
    try:
        prom = await prometheus_factory(scrape_targets={"exposition": [exporter.target]}, scrape_interval="1s")
        started = time.time()
        for _ in range(SECONDS):
            exporter.tick()
            await asyncio.sleep(1.0)
        client = PrometheusClient(prom.url)
        try:
            now = time.time()
            ask = lambda q: client.query_range(q, started, now, 1.0)  # noqa: E731
            triton_buckets = await ask(f'{TRITON}_bucket{{model="ranker", le="500"}}')
            triton_counts = await ask(f'{TRITON}_count{{model="ranker"}}')
            istio_q = ('{name}{{reporter="destination", destination_service_name="ranker", '
                       'destination_service_namespace="serving"{le}}}')
            istio_buckets = await ask(istio_q.format(name=f"{ISTIO}_bucket", le=', le="500"'))
            istio_counts = await ask(istio_q.format(name=f"{ISTIO}_count", le=""))
            as_float = await ask(f'{TRITON}_bucket{{model="ranker", le="500.0"}}')
        finally:
            client.close()
    finally:
        await exporter.stop()
    assert {s.labels["le"] for s in triton_buckets.series} == {"500"} and len(triton_counts.series) == 2
    assert {s.labels["destination_version"] for s in istio_buckets.series} == {"v1", "v2"}
    assert as_float.no_data  # Prometheus 2 keeps `le` as exposed (Prometheus 3 would store "500.0")
    triton = _decide(TailExcessParams(line=500, line_unit="ms", evidence="histogram"), triton_buckets,
                     triton_counts, "version", now)
    istio = _decide(TailExcessParams(line=500, line_unit="ms", evidence="histogram",
                                     version_label="destination_version"), istio_buckets, istio_counts,
                    "destination_version", now)
    assert triton["2"].fired and not triton["1"].fired, (triton["2"].reason, triton["1"].reason)
    assert istio["v2"].fired and not istio["v1"].fired, (istio["v2"].reason, istio["v1"].reason)
