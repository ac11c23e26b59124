"""The TimeoutSink protocol: read the current request timeout, write a new one optimistically.

A sink stores the timeout in its own text (`raw`: an Istio duration, a Gateway API duration, a
ConfigMap string, a JSON number); `encode`/`to_ms` convert. `write` is a compare-and-swap against
what `read` returned (resourceVersion, ETag): when someone else wrote in between it raises
Conflict, and the compare-and-swap loop (actions/_compare_and_swap.py) re-reads and decides
again, so nothing is ever overwritten blindly. Sinks never retry anything themselves.

`write` gets the step's effect key (`Step.effect_key`): Kubernetes sinks stamp the object with it
(annotation `tailguard.io/decision`, actions/_kube.py) and report the stamp they read in
`extra["mark"]`; the HTTP sink sends it as `Idempotency-Key`. Kubernetes sinks also report the
object (`extra["object"]`, "VirtualService serving/ranker") and who else owns it (`extra["owner"]`,
actions/_ownership.py), and take `allowOwnedBy` (`KubeSinkParams`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol

from pydantic import BaseModel, ConfigDict, Field

from actions._kube import CustomObject, mark_of
from actions._ownership import AllowOwnedBy, ownership_of
from core.durations import format_ms_duration, parse_duration
from core.outcome import PermanentError

if TYPE_CHECKING:
    from actions.base import ActionDeps

# Gateway API (GEP-2257) durations: at most four parts of at most five digits each.
_GATEWAY_DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")


class SinkParams(BaseModel):
    """Base of every sink's parameters: strict, `kind` is the registry key."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class KubeSinkParams(SinkParams):
    """Base of the sinks that write a Kubernetes object: owners whose object is written anyway."""

    allow_owned_by: AllowOwnedBy = Field((), alias="allowOwnedBy")


@dataclass(frozen=True)
class TimeoutReading:
    """The timeout as stored now. `raw` None: no timeout is set. `version`: the CAS token."""

    raw: Any
    ms: float | None
    version: str | None
    where: str  # human-readable location, e.g. "VirtualService serving/ranker route 'primary'"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"raw": self.raw, "ms": self.ms, "version": self.version, "where": self.where}


class TimeoutSink(Protocol):
    kind: ClassVar[str]
    Params: ClassVar[type[SinkParams]]

    def __init__(self, params: Any, deps: "ActionDeps") -> None: ...

    def encode(self, ms: int) -> Any:
        """The stored form of `ms` milliseconds for this sink."""

    def to_ms(self, raw: Any) -> float | None:
        """Milliseconds of a stored value; None when no timeout is set. Raises PermanentError."""

    async def read(self) -> TimeoutReading:
        """The current value with its CAS token. Raises ActionError."""

    async def write(self, raw: Any, expected: TimeoutReading, effect_key: str | None = None) -> TimeoutReading:
        """Store `raw` (None removes it) if the sink is still as `expected` said; Conflict if not.
        `effect_key` marks the write as the step's (None: unmarked)."""


def object_seen(kind: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """What a Kubernetes sink's reading reports of its object in `extra`: our stamp (`mark`), the
    object in words (`object`) and who else owns it (`owner`)."""
    return {"mark": mark_of(metadata.get("annotations")),
            "object": f"{kind} {metadata.get('namespace')}/{metadata.get('name')}",
            "owner": ownership_of(metadata)}


def duration_text(ms: float) -> str:
    """An Istio and Gateway API duration for whole milliseconds (`2500ms`, `3s`, `2m3s456ms`).

    The short form of core.durations when it fits GEP-2257's five digits, else h/m/s/ms parts.
    """
    short = format_ms_duration(ms)
    if _GATEWAY_DURATION.match(short):
        return short
    total = int(round(ms))
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def duration_ms(raw: Any) -> float | None:
    """Milliseconds of a stored duration string (`1.5s`, `2500ms`, `1m30s`); None when absent."""
    if raw is None or raw == "":
        return None
    try:
        return parse_duration(str(raw)) * 1000.0
    except ValueError as exc:
        raise PermanentError(f"stored timeout {raw!r} is not a duration: {exc}") from exc


class DurationSink:
    """Shared by sinks whose timeout is a duration string in a custom object (Istio, Gateway API).

    Their params name the object: namespace, name, apiVersion; the class names group and plural.
    """

    kind: ClassVar[str]
    group: ClassVar[str]
    plural: ClassVar[str]

    def __init__(self, params: Any, deps: "ActionDeps") -> None:
        self.params = params
        self._deps = deps

    def _object(self) -> CustomObject:
        p = self.params
        return CustomObject(self._deps.kube, f"the {self.kind} timeout sink", group=self.group,
                            version=p.api_version, plural=self.plural, namespace=p.namespace, name=p.name,
                            actuator=self._deps.actuator)

    def encode(self, ms: int) -> str:
        return duration_text(ms)

    def to_ms(self, raw: Any) -> float | None:
        return duration_ms(raw)


def value_patch(resource_version: str | None, path: str, current: Any, new: Any,
                parent: str | None = None) -> list[dict[str, Any]]:
    """RFC 6902 ops: `test` the resourceVersion and the old value, then set or remove the new one.

    `parent` is the JSON pointer of the enclosing object when it does not exist yet (it is added
    whole); None when it exists.
    """
    ops: list[dict[str, Any]] = []
    if resource_version is not None:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
    if current is not None:
        ops.append({"op": "test", "path": path, "value": current})
    if new is None:
        if current is not None:
            ops.append({"op": "remove", "path": path})
    elif parent is not None:
        ops.append({"op": "add", "path": parent, "value": {path.rsplit("/", 1)[1]: new}})
    else:
        ops.append({"op": "add", "path": path, "value": new})
    return ops
