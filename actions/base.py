"""The Action protocol: observe (I/O) -> plan (pure) -> apply -> verify -> revert.

One module per implementation; `actions.registry` maps the policy's `type:` to the class.

Delivery (docs/design-notes.md, "Delivery guarantees per action"): the executor journals the intent
of every apply before the call and its result after. A decision resumed after a crash calls
`verify` for a step whose intent has no result: an OK Outcome means the step's change landed
(recorded as applied, not applied again); anything else applies it again with the same
`Step.effect_key`. An action whose effect can be observed is therefore exactly-once; one whose
effect cannot be observed answers verify with NOOP and is at-least-once, and should hand the
effect key to the receiver (an `Idempotency-Key` header) so it can drop the repeat.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar, Mapping, Protocol

from pydantic import BaseModel, ConfigDict

from core.outcome import Outcome
from core.query import QueryResult
from core.signal import Signal
from core.target import Target

if TYPE_CHECKING:
    import aiohttp
    from kubernetes_asyncio.client import ApiClient


class ActionParams(BaseModel):
    """Base of every action's parameters: strict, so a typo in a policy is a load error."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


@dataclass(frozen=True)
class Step:
    """One concrete change an action decided on, computed without I/O.

    `action` is the action's kind (the policy's `type:`). `before` is what was observed, `after`
    what apply will make true; revert restores `before`. A step with `noop=True` is journaled and
    skipped: the world is already as wanted.

    `effect_key` is not planned: the executor fills it (`dataclasses.replace`) before it calls
    apply, verify or revert, as `"<decision id>/<step index>"`: the same on every attempt and
    after a restart, unique within one journal. Actions mark what they change with it, so a
    resumed decision recognises its own landed change: Kubernetes writes annotate the object
    (`tailguard.io/decision`), HTTP effects send `Idempotency-Key`. None outside the executor
    (simulate, the pin reconciler, direct calls): then nothing is marked.
    """

    action: str
    target: str
    summary: str
    before: Mapping[str, Any] = field(default_factory=dict)
    after: Mapping[str, Any] = field(default_factory=dict)
    noop: bool = False
    effect_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "target": self.target,
            "summary": self.summary,
            "before": dict(self.before),
            "after": dict(self.after),
            "noop": self.noop,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Step":
        """The step `as_dict` gave (a journaled plan's step); the effect key is the executor's to fill."""
        known = {f.name for f in fields(cls)} - {"effect_key"}
        return cls(**{k: v for k, v in data.items() if k in known})


# The header an HTTP effect that cannot be observed carries its `Step.effect_key` in.
IDEMPOTENCY_HEADER = "Idempotency-Key"

QueryFn = Callable[[str], Awaitable[QueryResult]]
EventFn = Callable[..., Awaitable[None]]
EndpointsFn = Callable[[Target], Awaitable[list[str]]]
KnownBadFn = Callable[[str], Awaitable[frozenset[int]]]


async def static_endpoints(target: Target) -> list[str]:
    """Triton base URLs listed in the policy (local mode, or outside a cluster)."""
    return list(target.triton_endpoints)


async def no_known_bad(target_key: str) -> frozenset[int]:
    """No version is known bad (no journal lent)."""
    return frozenset()


@dataclass
class ActionDeps:
    """What the daemon lends to actions: shared clients, created once for the app's lifetime."""

    http: "aiohttp.ClientSession | None" = None
    kube: "ApiClient | None" = None
    query: QueryFn | None = None  # instant PromQL query -> QueryResult
    record_event: EventFn | None = None  # Kubernetes Event on the target (no-op outside a cluster)
    # Ready Triton replicas of a target: static URLs, or a Service's EndpointSlices in a cluster.
    endpoints: EndpointsFn = static_endpoints
    triton_timeout_seconds: float = 30.0
    # Versions of a target (by key) marked bad in the journal: `triton.rollback to: previous` skips them.
    known_bad: KnownBadFn = no_known_bad


class Action(Protocol):
    kind: ClassVar[str]
    Params: ClassVar[type[ActionParams]]

    def __init__(self, deps: ActionDeps) -> None: ...

    async def observe(self, target: Target, params: Any) -> Mapping[str, Any]:
        """Read the current state needed to plan. Raises ActionError on failure."""

    def plan(
        self, target: Target, params: Any, observed: Mapping[str, Any], signal: Signal
    ) -> Step:
        """Pure: decide the change from what was observed. No I/O."""

    async def apply(self, step: Step, target: Target, params: Any) -> Outcome:
        """Make `step.after` true."""

    async def verify(self, step: Step, target: Target, params: Any) -> Outcome:
        """Check that `step.after` holds now: OK when it was observed to hold, FAILED when it does
        not; NOOP when the effect cannot be observed (a resumed decision then applies again)."""

    async def revert(self, step: Step, target: Target, params: Any) -> Outcome:
        """Restore `step.before` exactly."""
