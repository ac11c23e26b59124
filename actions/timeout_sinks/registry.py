"""The explicit list of timeout sinks: `sink.kind` -> class. An unknown kind is a load error."""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from actions.timeout_sinks.base import TimeoutSink
from actions.timeout_sinks.configmap import ConfigMapSink
from actions.timeout_sinks.http_endpoint import HttpEndpointSink
from actions.timeout_sinks.httproute import HTTPRouteSink
from actions.timeout_sinks.istio_route import IstioRouteSink

SINKS: Mapping[str, type[TimeoutSink]] = MappingProxyType({
    IstioRouteSink.kind: IstioRouteSink,
    HTTPRouteSink.kind: HTTPRouteSink,
    ConfigMapSink.kind: ConfigMapSink,
    HttpEndpointSink.kind: HttpEndpointSink,
})


def sink_class(kind: str) -> type[TimeoutSink]:
    """The sink class for `kind`; KeyError naming the known kinds otherwise."""
    try:
        return SINKS[kind]
    except KeyError:
        raise KeyError(f"unknown timeout sink kind {kind!r} (known: {', '.join(sorted(SINKS))})") from None
