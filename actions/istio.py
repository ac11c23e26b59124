"""`istio.shift_weights`: move traffic between the destinations of one Istio VirtualService http route.

Planning is pure (`plan_weights`); writes go through the one compare-and-swap loop
(actions/_compare_and_swap.py): JSON patches guarded by `test` ops on metadata.resourceVersion and
each old weight, so an edit by someone else between our read and our write is never overwritten.

Delivery: exactly-once by re-observation. Every write stamps the VirtualService with the step's
effect key (annotation `tailguard.io/decision`); a decision resumed after a crash between the
PATCH and its journal record verifies first, finds the weights (and our stamp) in place, and
records the step as applied without a second PATCH.

A VirtualService that Flagger, Argo Rollouts or a GitOps controller owns is refused (plan, and the
compare-and-swap right before each write) unless `allowOwnedBy` names that owner
(actions/_ownership.py). When verify finds the weights changed since our write, it says who changed
them last if managedFields tell, and does not fight it (not retryable).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from actions._compare_and_swap import compare_and_swap
from actions._istio_routes import GROUP, PLURAL, http_routes, select_route
from actions._kube import CustomObject, mark_of, mark_ops, marked_by, stamp_note
from actions._ownership import AllowOwnedBy, changed_by_note, last_writer, ownership_of, refusal, refuse_owned
from actions.base import ActionDeps, ActionParams, Step
from core.outcome import ActionError, Outcome, PermanentError
from core.signal import Signal
from core.target import Target

KIND = "istio.shift_weights"
Weights = list[dict[str, Any]]  # a route's destinations as journaled: host, subset, weight (None: absent)


class VirtualServiceRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)


class ShiftWeightsParams(ActionParams):
    """Which route of which VirtualService, and either absolute (`set`) or relative (`step`) weights.

    Keys of `set`/`step` are destination subset names (a destination without a subset is named
    by its host). Destinations the params do not name share the remainder (see `plan_weights`).
    """

    virtual_service: VirtualServiceRef = Field(alias="virtualService")
    api_version: Literal["v1", "v1beta1"] = Field("v1", alias="apiVersion")
    route: str | None = Field(None, min_length=1)  # the http route's `name`
    match: int | None = Field(None, ge=0)  # index into spec.http; neither given: the first route
    set_weights: dict[str, int] | None = Field(None, alias="set")
    step_weights: dict[str, int] | None = Field(None, alias="step")
    max_conflict_retries: int = Field(3, ge=0, le=10, alias="maxConflictRetries")
    request_timeout_seconds: float = Field(10.0, gt=0, le=120, alias="requestTimeoutSeconds")
    allow_owned_by: AllowOwnedBy = Field((), alias="allowOwnedBy")  # owners whose VirtualService we write anyway

    @field_validator("api_version", mode="before")
    @classmethod
    def _short_api_version(cls, value: Any) -> Any:
        # Accept the full form as written in manifests: networking.istio.io/v1beta1.
        return value.removeprefix(f"{GROUP}/") if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_mode(self) -> "ShiftWeightsParams":
        if self.route is not None and self.match is not None:
            raise ValueError("give at most one of 'route' (name) and 'match' (index)")
        if (self.set_weights is None) == (self.step_weights is None):
            raise ValueError("give exactly one of 'set' (absolute weights) and 'step' (relative)")
        weights = self.set_weights if self.set_weights is not None else self.step_weights
        if not weights:
            raise ValueError("'set'/'step' must name at least one subset")
        if self.set_weights is not None:
            if any(not 0 <= w <= 100 for w in self.set_weights.values()):
                raise ValueError("'set' weights are between 0 and 100")
            if sum(self.set_weights.values()) > 100:
                raise ValueError(f"'set' weights sum to {sum(self.set_weights.values())}, more than 100")
        elif any(not -100 <= d <= 100 for d in weights.values()):
            raise ValueError("'step' deltas are between -100 and 100")
        return self


# ---- pure decisions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    """One entry of an http route: `weight` is None when the field is absent from the object."""

    host: str
    subset: str | None
    weight: int | None

    @property
    def key(self) -> str:
        return self.subset if self.subset is not None else self.host

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "subset": self.subset, "weight": self.weight}


def route_destinations(http_route: Mapping[str, Any]) -> list[Destination]:
    """The destinations of one http route, in order, with weights exactly as stored."""
    return [
        Destination(d.get("destination", {}).get("host", ""), d.get("destination", {}).get("subset"),
                    d.get("weight"))
        for d in http_route.get("route") or []
    ]


def effective_weights(dests: Sequence[Destination]) -> list[int]:
    """Weights as Istio applies them: a lone destination without weight takes 100, others 0."""
    if len(dests) == 1 and dests[0].weight is None:
        return [100]
    return [d.weight or 0 for d in dests]


def largest_remainder(total: int, shares: Sequence[float]) -> list[int]:
    """Split `total` into integers proportional to `shares` (all equal when every share is 0).

    Rounding goes to the largest fractional parts; ties go to the earlier destination.
    """
    if not shares:
        return []
    base = list(shares) if sum(shares) > 0 else [1.0] * len(shares)
    exact = [total * s / sum(base) for s in base]
    floors = [int(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - floors[i]), i))
    for i in order[: total - sum(floors)]:
        floors[i] += 1
    return floors


def plan_weights(dests: Sequence[Destination], *, set_weights: Mapping[str, int] | None = None,
                 step_weights: Mapping[str, int] | None = None) -> list[int]:
    """New weights for `dests` (same order), always summing to 100.

    Named destinations get their absolute weight (`set`) or current + delta floored at 0 and
    capped at 100 (`step`). Destinations not named share what is left, in proportion to their
    current weights (evenly when they all have 0). With every destination named the weights must
    already sum to 100. Raises PermanentError for an unknown or ambiguous name, or no valid split.
    """
    wanted = dict(set_weights if set_weights is not None else step_weights or {})
    keys = [d.key for d in dests]
    unknown = sorted(set(wanted) - set(keys))
    if unknown:
        raise PermanentError(f"route has no destination {unknown} (it has {keys})")
    ambiguous = sorted(k for k in wanted if keys.count(k) > 1)
    if ambiguous:
        raise PermanentError(f"destination name {ambiguous} matches more than one destination")
    current = effective_weights(dests)
    new: list[int | None] = [None] * len(dests)
    for i, key in enumerate(keys):
        if key in wanted:
            value = wanted[key] if set_weights is not None else current[i] + wanted[key]
            new[i] = max(0, min(100, value))
    fixed = sum(w for w in new if w is not None)
    free = [i for i, w in enumerate(new) if w is None]
    if not free:
        if fixed != 100:
            raise PermanentError(f"weights of every destination must sum to 100, got {fixed}")
        return [int(w) for w in new if w is not None]
    if fixed > 100:
        raise PermanentError(f"named weights sum to {fixed}, more than 100")
    for i, share in zip(free, largest_remainder(100 - fixed, [current[i] for i in free])):
        new[i] = share
    return [int(w) for w in new if w is not None]


def _route_label(index: int, http_route: Mapping[str, Any]) -> str:
    return repr(http_route["name"]) if http_route.get("name") else f"#{index}"


def plan_shift(vs: Mapping[str, Any], params: ShiftWeightsParams) -> Step:
    """The Step for one VirtualService as read: before/after are the route's exact weights.

    Raises PermanentError when a change is due but someone else owns the object (`allowOwnedBy`)."""
    meta = vs.get("metadata", {})
    index = select_route(vs, params.route, params.match)
    http_route = http_routes(vs)[index]
    dests = route_destinations(http_route)
    if not dests:
        raise PermanentError(f"http route {_route_label(index, http_route)} has no destinations")
    weights = plan_weights(dests, set_weights=params.set_weights, step_weights=params.step_weights)
    route_ref = {"index": index, "name": http_route.get("name")}
    before = {"resourceVersion": meta.get("resourceVersion"), "route": route_ref,
              "destinations": [d.as_dict() for d in dests], "mark": mark_of(meta.get("annotations")),
              "owner": ownership_of(meta)}
    after = {"route": route_ref,
             "destinations": [{**d.as_dict(), "weight": w} for d, w in zip(dests, weights)]}
    noop = weights == effective_weights(dests)
    changes = ", ".join(f"{d.key} {w0}->{w1}" for d, w0, w1 in zip(dests, effective_weights(dests), weights))
    target = f"{meta.get('namespace')}/{meta.get('name')}"
    if not noop:
        refuse_owned(f"VirtualService {target}", meta, params.allow_owned_by)
    summary = (f"VirtualService {target} route {_route_label(index, http_route)}: "
               + ("weights already as wanted" if noop else changes))
    return Step(action=KIND, target=target, summary=summary, before=before, after=after, noop=noop)


def weights_patch(resource_version: str, index: int, current: Sequence[Destination],
                  desired: Sequence[int | None]) -> list[dict[str, Any]]:
    """An RFC 6902 patch: `test` the resourceVersion and each weight we change, then set them.

    A desired None removes the field (revert of a weight that was absent).
    """
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}]
    writes: list[dict[str, Any]] = []
    for j, (dest, weight) in enumerate(zip(current, desired)):
        if dest.weight == weight:
            continue
        path = f"/spec/http/{index}/route/{j}/weight"
        if dest.weight is not None:
            ops.append({"op": "test", "path": path, "value": dest.weight})
        writes.append({"op": "remove", "path": path} if weight is None
                      else {"op": "add", "path": path, "value": weight})
    return ops + writes


# ---- I/O ------------------------------------------------------------------------------------


def locate_route(vs: Mapping[str, Any], route: Mapping[str, Any]) -> tuple[int, list[Destination]]:
    """A step's route in a fresh read: by name when it has one (routes may have been inserted
    before it since), else by index; with its destinations."""
    name = route.get("name")
    index = select_route(vs, name, None) if name else int(route["index"])
    http = http_routes(vs)
    if index >= len(http):
        raise PermanentError(f"http route #{index} no longer exists")
    return index, route_destinations(http[index])


def show_weights(weights: Weights) -> str:
    """`v1 90, v2 10` (`unset` for an absent weight)."""
    return ", ".join(f"{Destination(**d).key} {'unset' if d['weight'] is None else d['weight']}"
                     for d in weights)


@dataclass(frozen=True)
class RouteReading:
    """One read of a route: the object's resourceVersion, the route's index, its destinations,
    our stamp on the object (`_kube.mark_of`; None: not known), and who else owns it
    (`_ownership.ownership_of`; None: not known)."""

    resource_version: str
    index: int
    destinations: list[Destination]
    mark: Mapping[str, Any] | None = None
    owner: Mapping[str, Any] | None = None


class RouteWeights:
    """The weights of one http route as a compare-and-swap value (actions._compare_and_swap.Swap)."""

    what = "weights"

    def __init__(self, vs: CustomObject, route: Mapping[str, Any], effect_key: str | None,
                 allowed: Sequence[str] = ()) -> None:
        self._vs = vs
        self._route = route  # {"index", "name"} as planned
        self._effect_key = effect_key  # stamped on the object by every write
        self._allowed = allowed  # owners whose object we write anyway (allowOwnedBy)

    async def read(self) -> RouteReading:
        vs = await self._vs.get()
        index, destinations = locate_route(vs, self._route)
        return RouteReading(str(vs["metadata"]["resourceVersion"]), index, destinations,
                            mark_of(vs["metadata"].get("annotations")), ownership_of(vs["metadata"]))

    def value(self, reading: RouteReading) -> Weights:
        return [d.as_dict() for d in reading.destinations]

    def where(self, reading: RouteReading) -> str:
        return (f"VirtualService {self._vs.namespace}/{self._vs.name} route "
                f"{_route_label(reading.index, self._route)}")

    def show(self, value: Weights) -> str:
        return show_weights(value)

    def ours(self, reading: RouteReading) -> bool:
        return marked_by(reading.mark, self._effect_key)

    def refusal(self, reading: RouteReading) -> str | None:
        return refusal(f"VirtualService {self._vs.namespace}/{self._vs.name}", reading.owner, self._allowed)

    async def write(self, reading: RouteReading, wanted: Weights) -> Mapping[str, Any]:
        ops = weights_patch(reading.resource_version, reading.index, reading.destinations,
                            [d["weight"] for d in wanted])
        written = await self._vs.patch(ops + mark_ops(reading.mark, self._effect_key))
        return {"resourceVersion": (written.get("metadata") or {}).get("resourceVersion")}


class ShiftWeights:
    """The `istio.shift_weights` action (see ShiftWeightsParams)."""

    kind: ClassVar[str] = KIND
    Params: ClassVar[type[ActionParams]] = ShiftWeightsParams
    advisory: ClassVar[bool] = False

    def __init__(self, deps: ActionDeps) -> None:
        self._deps = deps

    def _object(self, params: ShiftWeightsParams) -> CustomObject:
        ref = params.virtual_service
        return CustomObject(self._deps.kube, KIND, group=GROUP, version=params.api_version, plural=PLURAL,
                            namespace=ref.namespace, name=ref.name, timeout_seconds=params.request_timeout_seconds,
                            actuator=self._deps.actuator)

    async def observe(self, target: Target, params: ShiftWeightsParams) -> Mapping[str, Any]:
        return {"virtualService": await self._object(params).get()}

    def plan(self, target: Target, params: ShiftWeightsParams, observed: Mapping[str, Any],
             signal: Signal) -> Step:
        return plan_shift(observed["virtualService"], params)

    async def _swap(self, params: ShiftWeightsParams, step: Step, route: Mapping[str, Any],
                    expected: Sequence[Mapping[str, Any]], desired: Sequence[int | None], purpose: str,
                    seen: RouteReading | None) -> Outcome:
        """Compare-and-swap the route's weights from `expected` to `desired` (one per destination),
        stamped with the step's effect key."""
        before = [dict(e) for e in expected]
        wanted = [{**e, "weight": w} for e, w in zip(before, desired)]
        value = RouteWeights(self._object(params), route, step.effect_key, params.allow_owned_by)
        return await compare_and_swap(value, expected=before, wanted=wanted, purpose=purpose,
                                      max_retries=params.max_conflict_retries, seen=seen)

    async def apply(self, step: Step, target: Target, params: ShiftWeightsParams) -> Outcome:
        if step.noop:
            return Outcome.noop(step.summary)
        route, expected = step.before["route"], step.before["destinations"]
        version = step.before.get("resourceVersion")
        # The first try trusts what plan saw; the `test` ops check it server-side.
        seen = None if version is None else RouteReading(
            str(version), int(route["index"]), [Destination(**e) for e in expected], step.before.get("mark"),
            step.before.get("owner"))
        return await self._swap(params, step, route, expected, [d["weight"] for d in step.after["destinations"]],
                                "apply", seen)

    async def verify(self, step: Step, target: Target, params: ShiftWeightsParams) -> Outcome:
        try:
            vs = await self._object(params).get()
            _, current = locate_route(vs, step.after["route"])
        except ActionError as exc:
            return Outcome.failure(f"verify: {exc}", retryable=exc.retryable)
        seen = [d.as_dict() for d in current]
        if seen != list(step.after["destinations"]):
            # Changed since our write (a revert by its owner?): reported, never fought.
            return Outcome.failure(f"verify: route weights are {seen}, expected {list(step.after['destinations'])}"
                                   f"{changed_by_note(vs['metadata'])}", retryable=False, found=seen,
                                   changedBy=last_writer(vs["metadata"]))
        mark = mark_of(vs["metadata"].get("annotations"))
        return Outcome.success(f"verify: route weights as planned{stamp_note(mark, step.effect_key)}",
                               weights=seen, ours=marked_by(mark, step.effect_key))

    async def revert(self, step: Step, target: Target, params: ShiftWeightsParams) -> Outcome:
        """Restore exactly `step.before` (absent weights removed again), only from `step.after`."""
        if step.noop:
            return Outcome.noop("nothing was changed")
        return await self._swap(params, step, step.after["route"], step.after["destinations"],
                                [d["weight"] for d in step.before["destinations"]], "revert", None)
