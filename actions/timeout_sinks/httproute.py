"""Timeout sink `httproute`: `rules[i].timeouts.request` of a Gateway API HTTPRoute (v1 / v1beta1)."""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from actions._kube import mark_ops
from actions.timeout_sinks.base import (DurationSink, KubeSinkParams, SinkParams, TimeoutReading, duration_ms,
                                        object_seen, value_patch)
from core.outcome import PermanentError

GROUP, PLURAL = "gateway.networking.k8s.io", "httproutes"


class HTTPRouteSinkParams(KubeSinkParams):
    kind: Literal["httproute"]
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    api_version: Literal["v1", "v1beta1"] = Field("v1", alias="apiVersion")
    rule: int = Field(0, ge=0)  # index into spec.rules


class HTTPRouteSink(DurationSink):
    kind: ClassVar[str] = "httproute"
    group, plural = GROUP, PLURAL
    Params: ClassVar[type[SinkParams]] = HTTPRouteSinkParams
    params: HTTPRouteSinkParams

    async def read(self) -> TimeoutReading:
        p = self.params
        route = await self._object().get()
        rules = (route.get("spec") or {}).get("rules") or []
        if p.rule >= len(rules):
            raise PermanentError(f"HTTPRoute {p.namespace}/{p.name} has {len(rules)} rule(s), no rule #{p.rule}")
        timeouts = rules[p.rule].get("timeouts")
        raw = (timeouts or {}).get("request")
        return TimeoutReading(raw, self.to_ms(raw), str(route["metadata"]["resourceVersion"]),
                              f"HTTPRoute {p.namespace}/{p.name} rule #{p.rule}",
                              {"timeouts": timeouts, **object_seen("HTTPRoute", route["metadata"])})

    async def write(self, raw: Any, expected: TimeoutReading, effect_key: str | None = None) -> TimeoutReading:
        p = self.params
        timeouts = expected.extra.get("timeouts")
        backend = (timeouts or {}).get("backendRequest")
        if raw is not None and backend is not None and (duration_ms(backend) or 0) > (duration_ms(raw) or 0):
            # GEP-1742: backendRequest must not exceed request; the API server would refuse it.
            raise PermanentError(f"{expected.where}: timeouts.backendRequest {backend} exceeds the "
                                 f"new request timeout {raw}; not writing")
        base = f"/spec/rules/{p.rule}/timeouts"
        if raw is None and timeouts is not None and set(timeouts) <= {"request"}:
            # Restoring "no timeouts at all": drop the object we added, not just its key.
            ops = value_patch(expected.version, base, timeouts, None)
        else:
            ops = value_patch(expected.version, f"{base}/request", expected.raw, raw,
                              parent=None if timeouts is not None else base)
        written = await self._object().patch(ops + mark_ops(expected.extra.get("mark"), effect_key))
        return TimeoutReading(raw, self.to_ms(raw), str(written["metadata"]["resourceVersion"]),
                              expected.where, {"timeouts": _timeouts_after(timeouts, raw)})


def _timeouts_after(timeouts: dict[str, Any] | None, raw: Any) -> dict[str, Any] | None:
    rest = {k: v for k, v in (timeouts or {}).items() if k != "request"}
    if raw is not None:
        return {**rest, "request": raw}
    return rest or None
