"""The Detector protocol. `detect` is cheap and pure given prepared state; heavy work
(e.g. Prophet fits) happens in `prepare`, off the event loop through `offload`.

What the daemon reads of a detector is typed here, never a detail or an attribute by name: a firing
Detection's `recovery_line` and every Detection's `status`; its parameters' `recovery_rule`,
`version_label` and `max_staleness_seconds`."""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Awaitable, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from core.detection import Detection, DetectorStatus, RecoveryRule
from core.query import Series


class DetectorParams(BaseModel):
    """Base of every detector's parameters: strict, unknown keys are policy load errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    gives_budget_evidence: ClassVar[bool] = False
    """Its detections carry `budget` (requests above a line over the lookback): it can gate an
    alert trigger."""

    # Declared here because the daemon reads them of every detector; a detector that has its own
    # redeclares them with its own default (and bounds).
    version_label: str = Field("version", min_length=1)
    """The series label that names the serving version: the alert gate names versions by it
    (`policies.gate`), and detectors that tell versions apart (tail_excess, tail_canary, forecast
    attribution) read it."""
    max_staleness_seconds: float | None = Field(None, gt=0)
    """The newest point older than this is stale: never read as healthy or as firing. The poller
    also reads it as how old a series may be and still count as data; None (the default): the
    detector does not say, and the poller allows three trigger intervals, at least a minute."""

    @property
    @abstractmethod
    def recovery_rule(self) -> RecoveryRule | None:
        """How these parameters draw recovery lines, known before any detection: the side the query
        recovers on (and the level, when the parameters fix it). None: the query is not a level a
        Prometheus check could hold (counters), so no detection draws a line and a policy checks
        recovery only through its verify block (`tailguard validate` warns)."""

    def query_problem(self, query: str, companion_query: str | None) -> str | None:
        """What the trigger's queries alone show is wrong with these parameters (a load error,
        before any data: a histogram bucket below the line), None when nothing is."""
        return None


class ClusterReader(Protocol):
    """Reads one Kubernetes object (a GET; the daemon's client, loopback emulator in tests)."""

    async def get(self, group: str, version: str, plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The object, or None when it does not exist. Raises on any other failure."""


@runtime_checkable
class ReadsCluster(Protocol):
    """A detector whose decision needs what the cluster says (a canary judge: who is stable): the
    poller hands it the reader before each cycle's `detect_many`; the decision stays pure."""

    async def observe_cluster(self, reader: ClusterReader) -> None:
        """Read what the next decisions need; never raises (a failure becomes their reason)."""


def judges_together(detector: object) -> bool:
    """Whether a detector's verdict on one series depends on the other series of the same answer
    (`JUDGES_TOGETHER = True` on its class: the canary judge compares each canary with its stable,
    tail_excess calls versions breaching at once a shared slowdown). The poller then hands it the
    whole answer in one `detect_many`, however few series it has: one `detect` per series would
    judge each alone."""
    return bool(getattr(detector, "JUDGES_TOGETHER", False))


# offload(fn, *args) runs a picklable function in a process pool and awaits its result.
Offload = Callable[..., Awaitable[Any]]


class Detector(Protocol):
    """A detector: `kind` is the trigger's `type:`, `Params` its strict parameters. A firing
    Detection carries the `recovery_line` its `Params.recovery_rule` promises (none when the rule
    is None), drawn on the side the rule names unless the detection itself knows better (a
    two-sided test firing downwards recovers above)."""

    kind: ClassVar[str]
    Params: ClassVar[type[DetectorParams]]

    def __init__(self, params: Any) -> None: ...

    @property
    def lookback_seconds(self) -> float:
        """How much history `detect` needs; the poller range-queries this much."""

    async def prepare(self, batch: Sequence[Series], now: float, offload: Offload,
                      companions: Sequence[Series | None] | None = None) -> None:
        """Refresh cached models for series that are due. A no-op for stateless detectors.
        `companions[i]` is `batch[i]`'s series of the trigger's companion query, as `detect` gets
        it (the forecaster reads a request rate there)."""

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


def unpaired(
    detect: Callable[[Series, float, Series | None], Detection],
    series: Sequence[Series],
    now: float,
    companions: Sequence[Series | None] | None,
) -> list[Detection] | None:
    """The head of a `detect_many` that judges each series with its companion on one grid: nothing for
    no series, each series alone (`detect_each`) when a companion is missing, and None when every
    series has its companion (then the caller aligns them together)."""
    if not series:
        return []
    if companions is None or any(c is None for c in companions):
        return detect_each(detect, series, now, companions if companions is not None else [None] * len(series))
    return None


__all__ = ["ClusterReader", "Detector", "DetectorParams", "DetectorStatus", "Offload", "ReadsCluster", "detect_each",
           "judges_together", "unpaired"]
