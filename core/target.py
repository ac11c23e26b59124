"""Target: the model a policy protects and where its Triton replicas are found."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceRef:
    """A Kubernetes Service whose EndpointSlices list the Triton replicas."""

    namespace: str
    name: str
    port: int = 8000
    scheme: str = "http"


@dataclass(frozen=True)
class Target:
    """`model` is the Triton model name; `key` identifies the target in locks and cooldowns."""

    model: str
    namespace: str = "default"
    triton_endpoints: tuple[str, ...] = ()  # static base URLs, e.g. http://10.0.0.5:8000
    triton_service: ServiceRef | None = None
    triton_metrics: tuple[str, ...] = ()  # /metrics URLs read by detectors with source: triton

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.model}"
