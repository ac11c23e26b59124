"""Test helpers around the Kubernetes emulator: a kubeconfig for it, seed objects, a metrics exporter.

The kubeconfig and VirtualService helpers live in lab/kube/seeds.py (the demo uses them too) and
are re-exported here for the tests."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from lab.kube.seeds import kube_settings, virtual_service, write_kubeconfig

__all__ = ["GaugeExporter", "http_route", "kube_settings", "virtual_service", "write_kubeconfig"]


def http_route(name: str = "ranker", namespace: str = "serving",
               timeouts: dict[str, str] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"backendRefs": [{"name": name, "port": 8000}]}
    if timeouts is not None:
        rule["timeouts"] = timeouts
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"parentRefs": [{"name": "gw"}], "rules": [rule]}}


class GaugeExporter:
    """A tiny /metrics endpoint on loopback serving gauges whose values the test sets."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}  # series text (name{labels}) -> value
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        names = sorted({k.split("{")[0] for k in self.values})
        lines = [f"# TYPE {n} gauge" for n in names]
        lines += [f"{series} {value!r}" for series, value in sorted(self.values.items())]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def __aenter__(self) -> "GaugeExporter":
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"
