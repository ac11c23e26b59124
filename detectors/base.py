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

    def detect(self, series: Series, now: float, companion: Series | None = None) -> Detection:
        """Decide on one series. Never raises for bad data: returns fired=False with a reason.

        `companion` is the same target's series of the trigger's companion query (P99 beside
        P99.9); detectors that have no use for one ignore it.
        """

    def detect_many(
        self, series: Sequence[Series], now: float, companions: Sequence[Series | None] | None = None
    ) -> list[Detection]:
        """One Detection per series, in order, with the decision `detect` makes on each (with
        `companions[i]`). A vectorized path may count gaps on the shared grid in its details.

        May raise on input its vectorized path cannot take (e.g. malformed series); the caller
        then decides per series with `detect`, which never raises.
        """


def detect_each(
    detect: Callable[[Series, float, Series | None], Detection],
    series: Sequence[Series],
    now: float,
    companions: Sequence[Series | None] | None,
) -> list[Detection]:
    """`detect_many` for a detector without a vectorized path: one `detect` call per series."""
    if companions is None:
        return [detect(s, now, None) for s in series]
    if len(companions) != len(series):
        raise ValueError(f"{len(series)} series but {len(companions)} companions")
    return [detect(s, now, c) for s, c in zip(series, companions)]
