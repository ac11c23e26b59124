"""Timeout sink `istio`: the `timeout` of one http route of an Istio VirtualService (v1 / v1beta1)."""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from actions._istio_routes import GROUP, PLURAL, http_routes, select_route
from actions._kube import mark_ops
from actions.timeout_sinks.base import (DurationSink, KubeSinkParams, SinkParams, TimeoutReading, object_seen,
                                        value_patch)


class IstioRouteSinkParams(KubeSinkParams):
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


class IstioRouteSink(DurationSink):
    kind: ClassVar[str] = "istio"
    group, plural = GROUP, PLURAL
    Params: ClassVar[type[SinkParams]] = IstioRouteSinkParams
    params: IstioRouteSinkParams

    async def read(self) -> TimeoutReading:
        p = self.params
        vs = await self._object().get()
        index = select_route(vs, p.route, p.match)
        raw = http_routes(vs)[index].get("timeout")
        label = repr(p.route) if p.route else f"#{index}"
        return TimeoutReading(raw, self.to_ms(raw), str(vs["metadata"]["resourceVersion"]),
                              f"VirtualService {p.namespace}/{p.name} http route {label}",
                              {"index": index, **object_seen("VirtualService", vs["metadata"])})

    async def write(self, raw: Any, expected: TimeoutReading, effect_key: str | None = None) -> TimeoutReading:
        path = f"/spec/http/{int(expected.extra['index'])}/timeout"
        written = await self._object().patch(value_patch(expected.version, path, expected.raw, raw)
                                             + mark_ops(expected.extra.get("mark"), effect_key))
        return TimeoutReading(raw, self.to_ms(raw), str(written["metadata"]["resourceVersion"]),
                              expected.where, expected.extra)
