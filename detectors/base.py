"""The Detector protocol. `detect` is cheap and pure given prepared state; heavy work
(e.g. Prophet fits) happens in `prepare`, off the event loop through `offload`.

What planning reads of a detector is typed here, never a detail by name: a firing Detection's
`recovery_line`, and its parameters' `recovery_rule`."""
from __future__ import annotations

from abc import abstractmethod
from enum import IntEnum
from typing import Any, Awaitable, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

from pydantic import BaseModel, ConfigDict

from core.detection import Detection, RecoveryRule
from core.query import Series


class DetectorStatus(IntEnum):
    """Why a detector did or did not decide on a series, one meaning per value for every detector;
    only OK rows can fire. Vectorized code keeps int8 arrays of these values."""

    OK = 0
    """Decided: fired or not on the evidence."""
    NO_DATA = 1
    """No usable point (or no sample of both counters) in the lookback window."""
    STALE = 2
    """The newest point is older than the detector's `max_staleness_seconds`."""
    SHORT_HISTORY = 3
    """Too little history to compare against (a baseline, or a step with a bulk)."""
    NO_RECENT = 4
    """Points in the lookback, none in the evaluation window."""
    CONSTANT = 5
    """A constant series: nothing to compare."""
    COMPANION_MISSING = 6
    """The detector requires a companion series and it has no data."""
    NO_COUNTS = 7
    """No request counter beside the latency counter."""
    INCONSISTENT = 8
    """A histogram whose bucket at the line counts more than its total in every step."""


class DetectorParams(BaseModel):
    """Base of every detector's parameters: strict, unknown keys are policy load errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    gives_budget_evidence: ClassVar[bool] = False
    """Its detections carry `budget` (requests above a line over the lookback): it can gate an
    alert trigger."""

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
