"""Test helpers around the Kubernetes emulator: a kubeconfig for it, seed objects, a metrics exporter."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from lab.kube.emulator import KubeEmulator


def write_kubeconfig(path: Path, emulator: KubeEmulator) -> Path:
    """A kubeconfig pointing at the emulator (plain HTTP, no auth), for kubernetes.mode=kubeconfig."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": emulator.url}}],
        "users": [{"name": "tailguard", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tailguard"}}],
    }))
    return path


def kube_settings(kubeconfig: Path) -> dict[str, Any]:
    return {"mode": "kubeconfig", "kubeconfig": str(kubeconfig)}


def virtual_service(name: str = "ranker", namespace: str = "serving", timeout: str | None = None,
                    api_version: str = "networking.istio.io/v1") -> dict[str, Any]:
    route: dict[str, Any] = {"name": "primary", "route": [{"destination": {"host": name}}]}
    if timeout is not None:
        route["timeout"] = timeout
    return {"apiVersion": api_version, "kind": "VirtualService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"hosts": [name], "http": [route]}}


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
