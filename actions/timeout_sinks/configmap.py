"""Timeout sink `configmap`: one key of a ConfigMap, as milliseconds, seconds or a duration string."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from kubernetes_asyncio.client import CoreV1Api
from pydantic import Field

from actions import _kube
from actions.base import Effect
from actions.timeout_sinks.base import (KubeSinkParams, SinkParams, TimeoutReading, duration_ms, duration_text,
                                        object_seen, value_patch)
from core.outcome import PermanentError

if TYPE_CHECKING:
    from actions.base import ActionDeps


class ConfigMapSinkParams(KubeSinkParams):
    kind: Literal["configmap"]
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    key: str = Field(min_length=1, pattern=r"^[-._a-zA-Z0-9]+$")
    # How the value is written: "ms" -> "2500", "s" -> "2.5", "duration" -> "2500ms".
    format: Literal["ms", "s", "duration"] = "ms"


class ConfigMapSink:
    kind: ClassVar[str] = "configmap"
    Params: ClassVar[type[SinkParams]] = ConfigMapSinkParams

    def __init__(self, params: ConfigMapSinkParams, deps: "ActionDeps") -> None:
        self.params = params
        self._deps = deps

    def _api(self) -> CoreV1Api:
        return CoreV1Api(_kube.client(self._deps.kube, "the configmap timeout sink"))

    def encode(self, ms: int) -> str:
        if self.params.format == "ms":
            return str(int(ms))
        if self.params.format == "s":
            return f"{ms / 1000:g}"
        return duration_text(ms)

    def to_ms(self, raw: Any) -> float | None:
        if raw is None or raw == "":
            return None
        if self.params.format == "duration":
            return duration_ms(raw)
        try:
            number = float(raw)
        except ValueError as exc:
            raise PermanentError(f"ConfigMap key {self.params.key}={raw!r} is not a number") from exc
        return number if self.params.format == "ms" else number * 1000.0

    def _where(self) -> str:
        p = self.params
        return f"ConfigMap {p.namespace}/{p.name} key {p.key!r}"

    async def read(self) -> TimeoutReading:
        p = self.params
        api = self._api()
        cm = await _kube.read(f"get configmaps {p.namespace}/{p.name}", api.read_namespaced_config_map(
            p.name, p.namespace, _request_timeout=_kube.REQUEST_TIMEOUT_SECONDS))
        data = cm.data
        raw = (data or {}).get(p.key)
        metadata = api.api_client.sanitize_for_serialization(cm.metadata)  # the API's JSON form
        return TimeoutReading(raw, self.to_ms(raw), cm.metadata.resource_version, self._where(),
                              {"has_data": data is not None, **object_seen("ConfigMap", metadata)})

    async def write(self, raw: Any, expected: TimeoutReading, effect_key: str | None = None) -> TimeoutReading:
        p = self.params
        key = p.key.replace("~", "~0").replace("/", "~1")
        ops = value_patch(expected.version, f"/data/{key}", expected.raw, raw,
                          parent=None if expected.extra.get("has_data") else "/data")
        ops += _kube.mark_ops(expected.extra.get("mark"), effect_key)
        what = f"patch configmaps {p.namespace}/{p.name}"

        async def send() -> Any:
            return await _kube.write(what, self._api().patch_namespaced_config_map(
                p.name, p.namespace, ops, field_manager=_kube.FIELD_MANAGER, _content_type=_kube.JSON_PATCH,
                _request_timeout=_kube.REQUEST_TIMEOUT_SECONDS))

        cm = await self._deps.actuator.write(Effect("kube.patch", what, timeout_seconds=_kube.REQUEST_TIMEOUT_SECONDS,
                                                    data={"ops": ops}), send)
        return TimeoutReading(raw, self.to_ms(raw), cm.metadata.resource_version, self._where(),
                              {"has_data": True})
