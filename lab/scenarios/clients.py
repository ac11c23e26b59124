"""The clients' side of a demo: every answer the load generator got, served on a loopback /metrics
three ways: the latency quantiles they saw over a short window (a gauge), a latency histogram per
model version with a bucket bound at the line, and the same latencies as the mesh exports them
(Istio's `istio_request_duration_milliseconds`, its labels and default buckets); and a router that
picks v1 or v2 per request by the VirtualService's current weights, as the mesh would.

In the lab, the router and this view play the mesh's two parts: the sidecar's routing by subset
weight, and the sidecar's telemetry naming the destination's version (`destination_version`, the
pod's `version` label: `v1`, `v2`). So a policy written for Istio in the field
(examples/policies/canary.yaml) runs on the lab unchanged.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from lab.load import RequestSample
from lab.ports import LOOPBACK
from lab.scenarios.timeline import window_quantiles

METRIC = "lab_client_latency_ms"
"""The clients' P50/P99/P99.9 gauge (milliseconds), labelled model and quantile."""
HISTOGRAM = "lab_client_request_duration_ms"
"""The clients' latency histogram (milliseconds), labelled model and version: `_bucket`, `_count`."""
BUCKETS_MS = (5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0)
"""Bounds as a mesh's defaults run, with one at the demos' line (500 ms)."""
MESH_HISTOGRAM = "istio_request_duration_milliseconds"
"""The latencies under Istio's name and labels (`reporter`, `destination_service_name`,
`destination_service_namespace`, `destination_workload`, `destination_version`, `response_code`)."""
MESH_BUCKETS_MS = (0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000,
                   1800000, 3600000)
"""Istio's default bounds, written as its sidecar writes them (`le="500"`, not `500.0`)."""


class ClientView:
    """Records samples and serves the trailing-window quantiles on ``/metrics`` (loopback only)."""

    def __init__(self, model: str, window_seconds: float, clock: Callable[[], float] = time.time,
                 namespace: str = "serving", keep: int | None = None) -> None:
        """`keep`: hold only about this many recent samples (a process whose samples the parent
        reads from a file needs no more for its quantiles); None keeps every one (the report's)."""
        self.keep = keep
        self.model = model
        self.mesh = MeshHistogram(model, namespace)
        self.window_seconds = window_seconds
        self.samples: list[RequestSample] = []
        self._clock = clock
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.registry = CollectorRegistry()
        self.histogram = Histogram(HISTOGRAM, "Client-side request latency by model version (ms).",
                                   ["model", "version"], buckets=BUCKETS_MS, registry=self.registry)

    def record(self, sample: RequestSample) -> None:
        """The load generator's `on_sample` callback."""
        self.samples.append(sample)
        if self.keep is not None and len(self.samples) > 2 * self.keep:
            del self.samples[:-self.keep]
        if sample.status == 200 and sample.model_version is not None:
            self.histogram.labels(self.model, sample.model_version).observe(sample.latency_seconds * 1000.0)
            self.mesh.observe(f"v{sample.model_version}", sample.latency_seconds * 1000.0)

    def quantiles(self) -> dict[str, float]:
        """P50/P99/P99.9 in ms over the trailing window, now."""
        # Only the tail of the list can be in the window: bounded work per scrape on long runs.
        recent = self.samples[-5000:]
        return window_quantiles(recent, self._clock(), self.window_seconds)

    async def _metrics(self, request: web.Request) -> web.Response:
        lines = [f"# TYPE {METRIC} gauge"]
        for name, value in self.quantiles().items():
            if not math.isnan(value):  # no answers in the window: no sample, never a made-up 0
                q = {"P50": "0.5", "P99": "0.99", "P99.9": "0.999"}[name]
                lines.append(f'{METRIC}{{model="{self.model}",quantile="{q}"}} {value!r}')
        text = "\n".join(lines) + "\n" + generate_latest(self.registry).decode() + self.mesh.exposition()
        return web.Response(text=text, content_type="text/plain")

    async def start(self, port: int = 0) -> None:
        """Serve /metrics on loopback, on `port` (0: a free one)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def target(self) -> str:
        """``host:port`` for a Prometheus scrape config."""
        return f"{LOOPBACK}:{self.port}"


class MeshHistogram:
    """Answers as an Istio sidecar (reporter `destination`) counts them, per destination version:
    cumulative buckets at Istio's default bounds, `_sum` and `_count`, in the text format.

    `drop_version`: versions whose series are written without `destination_version` (a workload
    whose pods lack the label), for the bad-input tests."""

    def __init__(self, service: str, namespace: str) -> None:
        self.service = service
        self.namespace = namespace
        self.drop_version: set[str] = set()
        self._buckets: dict[str, list[int]] = {}
        self._sum: dict[str, float] = {}

    def observe(self, version: str, latency_ms: float) -> None:
        counts = self._buckets.setdefault(version, [0] * (len(MESH_BUCKETS_MS) + 1))
        for i, bound in enumerate(MESH_BUCKETS_MS):
            if latency_ms <= bound:
                counts[i] += 1
        counts[-1] += 1  # +Inf
        self._sum[version] = self._sum.get(version, 0.0) + latency_ms

    def _labels(self, version: str) -> str:
        labels = {"reporter": "destination", "destination_service_name": self.service,
                  "destination_service_namespace": self.namespace,
                  "destination_workload": f"{self.service}-{version}", "response_code": "200"}
        if version not in self.drop_version:
            labels["destination_version"] = version
        return ",".join(f'{k}="{v}"' for k, v in labels.items())

    def exposition(self) -> str:
        name = MESH_HISTOGRAM
        lines = [f"# HELP {name} Requests' duration as the mesh sees them (ms).", f"# TYPE {name} histogram"]
        for version, counts in sorted(self._buckets.items()):
            labels = self._labels(version)
            for bound, count in zip((*(f"{b:g}" for b in MESH_BUCKETS_MS), "+Inf"), counts):
                lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {count}')
            lines.append(f"{name}_sum{{{labels}}} {self._sum[version]!r}")
            lines.append(f"{name}_count{{{labels}}} {counts[-1]}")
        return "\n".join(lines) + "\n"


def uniform_inputs(seed: int = 11) -> Callable[[], Sequence[float]]:
    """Each request's input, its first value uniform in [0, 1): a model whose slow path takes the
    requests whose first value is below a fault's rate (lab/triton.py) slows a seeded random share."""
    rng = random.Random(seed)
    return lambda: [rng.random(), 1.0, 1.0, 1.0]


def subset_version(subset: str) -> str:
    """Istio subset name -> Triton version (``v2`` -> ``2``)."""
    return subset[1:] if subset.startswith("v") and subset[1:].isdigit() else subset


def pick_by_weight(weights: Mapping[str, int], draw: float) -> str | None:
    """The subset a uniform `draw` in [0, 1) lands on, by cumulative weight; None when all are 0."""
    total = sum(w for w in weights.values() if w > 0)
    if total <= 0:
        return None
    point = draw * total
    for subset, weight in weights.items():
        if weight <= 0:
            continue
        if point < weight:
            return subset
        point -= weight
    return [s for s, w in weights.items() if w > 0][-1]


class WeightedRouter:
    """Per request, the Triton version the VirtualService's weights send it to (read live each time)."""

    def __init__(self, read_weights: Callable[[], Mapping[str, int]], seed: int = 0) -> None:
        self._read = read_weights
        self._rng = random.Random(seed)

    def __call__(self) -> str | None:
        subset = pick_by_weight(self._read(), self._rng.random())
        return subset_version(subset) if subset is not None else None
