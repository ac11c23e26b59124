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
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar, Mapping, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict

from core.outcome import ActionError, Outcome
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


@dataclass(frozen=True)
class Replicas:
    """Every replica a target has, by per-pod URL: those its discovery says are ready, and those it
    lists as not ready (down, starting, failing their probe), which an action counts but cannot reach."""

    ready: tuple[str, ...]
    not_ready: tuple[str, ...] = ()


ReplicasFn = Callable[[Target], Awaitable[Replicas]]
WriteFenceFn = Callable[[float], Awaitable[str | None]]
"""Called by the door right before every write (and by triton.rollback before it reads what to
write) with that request's timeout: waits out a takeover's fence, then None when this replica may
write, else why not (it no longer holds the Lease). Triton's model control takes no precondition:
this is its fence."""
KnownBadFn = Callable[[str], Awaitable[frozenset[int]]]


T = TypeVar("T")


@dataclass(frozen=True)
class Effect:
    """One write to the world, as an action announces it to the door (`Actuator.write`).

    `kind`: "triton.load", "kube.patch", "sink.write". `summary`: the write in words (journaled).
    `loads`: the model version a Triton load makes served (the door refuses a version marked bad);
    None for every other write. `target`: the target key when the action knows it (the door checks
    it is the one its caller acts on)."""

    kind: str
    summary: str
    target: str | None = None
    loads: int | None = None
    timeout_seconds: float = 30.0  # the request's own timeout: a takeover's fence waits it out
    data: Mapping[str, Any] = field(default_factory=dict)


class Refused(ActionError):
    """The door refused a write: nothing was sent, and the refusal is journaled. `check` names the
    question that said no ("leader", "fence", "freeze", "bad_version", "writer", "journal"). Only a
    journal that could not be read or written is worth trying again (`retryable`)."""

    def __init__(self, check: str, reason: str, retryable: bool = False) -> None:
        super().__init__(f"refused by the door ({check}): {reason}", retryable=retryable)
        self.check = check
        self.reason = reason


class Actuator(Protocol):
    """The one door every write to the world passes (daemon/workers/door.py in the daemon).

    `write` asks, at the moment of the write, everything that may forbid it (leadership and the fence
    term, every freeze covering the target, known-bad versions), journals the intent, calls `send`
    (the request itself, built by the action from its client), and journals the result. It raises
    `Refused` without calling `send` when a check says no, and re-raises what `send` raises."""

    async def write(self, effect: Effect, send: Callable[[], Awaitable[T]]) -> T: ...

    async def ask(self, effect: Effect) -> Refused | None:
        """What `write` would refuse now (None: it would let it through), without writing or
        journaling: a caller that would only be refused again on every pass asks first."""


class Unguarded:
    """An actuator that asks nothing and journals nothing: for actions driven outside the daemon
    (tests of one action against an emulator, tools with no journal). The daemon always lends its
    door instead (daemon/wiring/parts.py); tests/unit/test_door_writes.py checks that it does."""

    async def write(self, effect: Effect, send: Callable[[], Awaitable[T]]) -> T:
        return await send()

    async def ask(self, effect: Effect) -> Refused | None:
        return None


UNGUARDED = Unguarded()


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
    # Every replica of a target, ready or not (a Service's EndpointSlices); None: `endpoints` (ready only).
    replicas: ReplicasFn | None = None
    # Before each Triton write (None: always allowed, no leader election).
    write_fence: WriteFenceFn | None = None
    # The door every write passes (Triton loads, Kubernetes patches, timeout sinks); the daemon's
    # checks freezes, leadership and bad marks and journals each write (daemon/workers/door.py).
    actuator: Actuator = UNGUARDED


class Action(Protocol):
    """An action: `kind` is the policy's `type:`, `Params` its strict parameters. `advisory`: its
    failure never stops a plan (a notification): the step is journaled failed and the plan goes on;
    every other action's failure ends the plan (`guards.onFailure` follows)."""

    kind: ClassVar[str]
    Params: ClassVar[type[ActionParams]]
    advisory: ClassVar[bool]

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


@dataclass(frozen=True)
class PinCheck:
    """A pin compared with what a target's replicas serve, planned without I/O (`Pinning.plan_pin`)."""

    step: Step  # what puts every observed replica on the pinned version; `noop` when all are on it
    ready_versions: tuple[int, ...]  # versions READY on any observed replica, ascending
    drifted: Mapping[str, Any]  # replica -> the versions it served instead (what `step` changes)
    replicas: int  # replicas observed
    unreachable: Mapping[str, str]  # replica -> why it could not be read


@runtime_checkable
class Pinning(Protocol):
    """What an action that pins a target's model to one version offers the pin reconciler
    (daemon/workers/pins.py), which keeps every replica on the version a verified step of it pinned
    (its Outcome's `pin` data): replicas started later load the newest version otherwise.

    The reconciler observes with `pin_params(version)`, plans with `plan_pin`, and applies and
    verifies the step with the action's own `apply` and `verify`.
    """

    def pin_params(self, version: int) -> ActionParams:
        """The action's parameters that pin exactly `version`."""

    def plan_pin(self, target: Target, params: Any, observed: Mapping[str, Any]) -> PinCheck:
        """Pure: the step that re-applies the pin to the replicas `observe` found, and what they
        serve. Raises ActionError when there is nothing to pin (no reachable replica)."""


@runtime_checkable
class Preconditions(Protocol):
    """What an action whose effect must not land on a target that changed since the plan offers a
    decision resumed after a restart or a journal outage: the executor calls `preconditions` for
    every step it is about to apply or re-verify, and ends the decision `expired` (applying nothing
    more) when one does not hold. An action without it is resumed on the signal's age alone
    (Kubernetes writes compare-and-swap against `before` anyway)."""

    async def preconditions(self, step: Step, target: Target, params: Any) -> Outcome:
        """Re-observe the target: OK when it is still as `step.before` found it, or `step.after`
        already holds (the step landed); FAILED naming what changed otherwise. A part of the target
        that cannot be read is no change (its apply deals with it)."""


class PinningAction(Action, Pinning, Protocol):
    """An action that pins versions: the Action protocol and Pinning."""


def pinning_action(actions: Mapping[str, type[Action]]) -> type[PinningAction] | None:
    """The action of the registry `actions` that pins versions, or None when none does.

    Raises:
        ValueError: more than one does (a pin would not say whose it is).
    """
    found = [cls for cls in actions.values() if issubclass(cls, Pinning)]
    if len(found) > 1:
        raise ValueError(f"more than one action pins versions: {', '.join(sorted(c.kind for c in found))}")
    return found[0] if found else None
