"""The Detector protocol. `detect` is cheap and pure given prepared state; heavy work
(e.g. Prophet fits) happens in `prepare`, off the event loop through `offload`."""
from __future__ import annotations

from typing import Any, Awaitable, Callable, ClassVar, Protocol, Sequence

from pydantic import BaseModel, ConfigDict

from core.detection import Detection
from core.query import Series


class DetectorParams(BaseModel):
    """Base of every detector's parameters: strict, unknown keys are policy load errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# offload(fn, *args) runs a picklable function in a process pool and awaits its result.
Offload = Callable[..., Awaitable[Any]]


class Detector(Protocol):
    kind: ClassVar[str]
    Params: ClassVar[type[DetectorParams]]

    def __init__(self, params: Any) -> None: ...

    @property
    def lookback_seconds(self) -> float:
        """How much history `detect` needs; the poller range-queries this much."""

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload) -> None:
        """Refresh cached models for series that are due. A no-op for stateless detectors."""

    def detect(self, series: Series, now: float) -> Detection:
        """Decide on one series. Never raises for bad data: returns fired=False with a reason."""
