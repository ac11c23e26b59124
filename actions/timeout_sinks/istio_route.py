"""Timeout sink `istio`: the `timeout` of one http route of an Istio VirtualService (v1 / v1beta1)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from actions.timeout_sinks import _kube
from actions.timeout_sinks.base import DurationSink, SinkParams, TimeoutReading, value_patch
from core.outcome import PermanentError

GROUP, PLURAL = "networking.istio.io", "virtualservices"


class IstioRouteSinkParams(SinkParams):
    kind: Literal["istio"]
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    api_version: Literal["v1", "v1beta1"] = Field("v1", alias="apiVersion")
    route: str | None = Field(None, min_length=1)  # the http route's `name`
    match: int | None = Field(None, ge=0)  # index into spec.http; neither: the first route

    @model_validator(mode="after")
    def _one_selector(self) -> "IstioRouteSinkParams":
        if self.route is not None and self.match is not None:
            raise ValueError("give at most one of 'route' (name) and 'match' (index)")
        return self


def route_index(vs: dict[str, Any], route: str | None, match: int | None) -> int:
    http = (vs.get("spec") or {}).get("http") or []
    if route is not None:
        for i, r in enumerate(http):
            if r.get("name") == route:
                return i
        raise PermanentError(f"no http route named {route!r} (routes: {[r.get('name') for r in http]})")
    index = match or 0
    if index >= len(http):
        raise PermanentError(f"http route index {index} out of range ({len(http)} route(s))")
    return index


class IstioRouteSink(DurationSink):
    kind = "istio"
    Params = IstioRouteSinkParams
    params: IstioRouteSinkParams

    async def read(self) -> TimeoutReading:
        p = self.params
        vs = await _kube.get_custom(self._deps, self.kind, GROUP, p.api_version, p.namespace, PLURAL, p.name)
        index = route_index(vs, p.route, p.match)
        raw = vs["spec"]["http"][index].get("timeout")
        label = repr(p.route) if p.route else f"#{index}"
        return TimeoutReading(raw, self.to_ms(raw), str(vs["metadata"]["resourceVersion"]),
                              f"VirtualService {p.namespace}/{p.name} http route {label}",
                              {"index": index})

    async def write(self, raw: Any, expected: TimeoutReading) -> TimeoutReading:
        p = self.params
        path = f"/spec/http/{int(expected.extra['index'])}/timeout"
        written = await _kube.patch_custom(self._deps, self.kind, GROUP, p.api_version, p.namespace, PLURAL,
                                           p.name, value_patch(expected.version, path, expected.raw, raw))
        return TimeoutReading(raw, self.to_ms(raw), str(written["metadata"]["resourceVersion"]),
                              expected.where, expected.extra)
