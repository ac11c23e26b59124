"""The clients' side of a demo: every answer the load generator got, the latency quantiles they saw
over a short window served on a loopback /metrics (as a mesh's histograms would be), and a router
that picks v1 or v2 per request by the VirtualService's current weights, as the mesh would.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping

from aiohttp import web

from lab.load import RequestSample
from lab.ports import LOOPBACK
from lab.scenarios.timeline import window_quantiles

METRIC = "lab_client_latency_ms"
"""The clients' P50/P99/P99.9 gauge (milliseconds), labelled model and quantile."""


class ClientView:
    """Records samples and serves the trailing-window quantiles on ``/metrics`` (loopback only)."""

    def __init__(self, model: str, window_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self.model = model
        self.window_seconds = window_seconds
        self.samples: list[RequestSample] = []
        self._clock = clock
        self._runner: web.AppRunner | None = None
        self.port = 0

    def record(self, sample: RequestSample) -> None:
        """The load generator's `on_sample` callback."""
        self.samples.append(sample)

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
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, 0)
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
