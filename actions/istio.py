"""`istio.shift_weights`: move traffic between the destinations of one Istio VirtualService http route.

Planning is pure (`plan_weights`); writes are optimistic JSON patches guarded by a `test` op on
metadata.resourceVersion, so an edit by someone else between our read and our write is never
overwritten blindly.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import aiohttp
from kubernetes_asyncio.client import CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from actions._kube_errors import api_error, is_precondition_failure, server_message
from actions.base import ActionDeps, ActionParams, Step
from core.outcome import ActionError, Outcome, PermanentError
from core.signal import Signal
from core.target import Target

KIND = "istio.shift_weights"
GROUP, PLURAL = "networking.istio.io", "virtualservices"
# Between conflict retries: 0.05 s, 0.1 s, 0.2 s ... capped; conflicts clear as soon as we re-read.
_BACKOFF_BASE_SECONDS = 0.05
_BACKOFF_MAX_SECONDS = 1.0


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


def select_route(spec: Mapping[str, Any], route: str | None, match: int | None) -> int:
    """The index in spec.http of the route to change: by name, by index, or the first one."""
    http = spec.get("http") or []
    if route is not None:
        found = [i for i, r in enumerate(http) if r.get("name") == route]
        if not found:
            names = [r.get("name") for r in http]
            raise PermanentError(f"no http route named {route!r} (routes: {names})")
        return found[0]
    index = match or 0
    if index >= len(http):
        raise PermanentError(f"http route index {index} out of range ({len(http)} route(s))")
    return index


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
    """The Step for one VirtualService as read: before/after are the route's exact weights."""
    meta = vs.get("metadata", {})
    index = select_route(vs.get("spec") or {}, params.route, params.match)
    http_route = vs["spec"]["http"][index]
    dests = route_destinations(http_route)
    if not dests:
        raise PermanentError(f"http route {_route_label(index, http_route)} has no destinations")
    weights = plan_weights(dests, set_weights=params.set_weights, step_weights=params.step_weights)
    route_ref = {"index": index, "name": http_route.get("name")}
    before = {"resourceVersion": meta.get("resourceVersion"), "route": route_ref,
              "destinations": [d.as_dict() for d in dests]}
    after = {"route": route_ref,
             "destinations": [{**d.as_dict(), "weight": w} for d, w in zip(dests, weights)]}
    noop = weights == effective_weights(dests)
    changes = ", ".join(f"{d.key} {w0}->{w1}" for d, w0, w1 in zip(dests, effective_weights(dests), weights))
    target = f"{meta.get('namespace')}/{meta.get('name')}"
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


class _Conflict(Exception):
    """Our precondition did not hold (409, or 422 from a failed `test` op): re-read and re-plan."""


class ShiftWeights:
    """The `istio.shift_weights` action (see ShiftWeightsParams)."""

    kind = KIND
    Params = ShiftWeightsParams

    def __init__(self, deps: ActionDeps) -> None:
        self._deps = deps

    def _api(self) -> CustomObjectsApi:
        if self._deps.kube is None:
            raise PermanentError("istio.shift_weights needs a Kubernetes client (deps.kube is None)")
        return CustomObjectsApi(self._deps.kube)

    def _fail(self, exc: BaseException, verb: str, params: ShiftWeightsParams) -> ActionError:
        """Turn a client error into the action's error taxonomy, naming what was attempted."""
        ref = params.virtual_service
        return api_error(exc, f"{verb} {PLURAL}.{GROUP} {ref.namespace}/{ref.name}")

    async def _read(self, params: ShiftWeightsParams) -> dict[str, Any]:
        ref = params.virtual_service
        try:
            return await self._api().get_namespaced_custom_object(
                GROUP, params.api_version, ref.namespace, PLURAL, ref.name,
                _request_timeout=params.request_timeout_seconds)
        except (ApiException, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._fail(exc, "get", params) from exc

    async def _patch(self, params: ShiftWeightsParams, ops: list[dict[str, Any]]) -> dict[str, Any]:
        ref = params.virtual_service
        try:
            return await self._api().patch_namespaced_custom_object(
                GROUP, params.api_version, ref.namespace, PLURAL, ref.name, ops,
                _content_type="application/json-patch+json",
                _request_timeout=params.request_timeout_seconds)
        except ApiException as exc:
            if is_precondition_failure(exc):
                raise _Conflict(server_message(exc)) from exc
            raise self._fail(exc, "patch", params) from exc
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._fail(exc, "patch", params) from exc

    async def observe(self, target: Target, params: ShiftWeightsParams) -> Mapping[str, Any]:
        return {"virtualService": await self._read(params)}

    def plan(self, target: Target, params: ShiftWeightsParams, observed: Mapping[str, Any],
             signal: Signal) -> Step:
        return plan_shift(observed["virtualService"], params)

    async def _write_weights(self, params: ShiftWeightsParams, route: Mapping[str, Any],
                             expected: Sequence[Mapping[str, Any]], desired: Sequence[int | None],
                             resource_version: str | None, purpose: str) -> Outcome:
        """Compare-and-swap the route's weights from `expected` to `desired`, re-reading on conflict.

        After a conflict the object is re-read and the route re-resolved (by name when it has one):
        an unrelated edit (labels, other routes) is retried on the fresh resourceVersion; weights
        already at `desired` are a noop; weights changed by someone else are left alone (failure).
        """
        want = [{**e, "weight": w} for e, w in zip(expected, desired)]
        last = ""
        for attempt in range(params.max_conflict_retries + 1):
            if attempt:
                await asyncio.sleep(min(_BACKOFF_MAX_SECONDS, _BACKOFF_BASE_SECONDS * 2 ** (attempt - 1)))
            if resource_version is None:  # after a conflict (or for revert): plan from a fresh read
                vs = await self._read(params)
                resource_version = str(vs["metadata"]["resourceVersion"])
                index, current = self._locate(vs, route)
            else:  # first apply attempt: trust what plan saw; the `test` op checks it server-side
                index, current = int(route["index"]), [Destination(**e) for e in expected]
            seen = [d.as_dict() for d in current]
            if seen == want:
                return Outcome.noop(f"{purpose}: weights already as wanted", weights=want)
            if seen != list(expected):
                return Outcome.failure(
                    f"{purpose}: route weights were changed by someone else (expected {list(expected)}, "
                    f"found {seen}); not overwriting", expected=list(expected), found=seen)
            try:
                written = await self._patch(params, weights_patch(resource_version, index, current, desired))
            except _Conflict as exc:
                last, resource_version = str(exc), None
                continue
            return Outcome.success(f"{purpose}: weights written", weights=want, attempts=attempt + 1,
                                   resourceVersion=written.get("metadata", {}).get("resourceVersion"))
        return Outcome.failure(f"{purpose}: still conflicting after {params.max_conflict_retries + 1} "
                               f"attempt(s): {last}", retryable=True)

    @staticmethod
    def _locate(vs: Mapping[str, Any], route: Mapping[str, Any]) -> tuple[int, list[Destination]]:
        # A named route is found by name again: someone may have inserted routes before it.
        name = route.get("name")
        index = select_route(vs.get("spec") or {}, name, None) if name else int(route["index"])
        http = (vs.get("spec") or {}).get("http") or []
        if index >= len(http):
            raise PermanentError(f"http route #{index} no longer exists")
        return index, route_destinations(http[index])

    async def apply(self, step: Step, target: Target, params: ShiftWeightsParams) -> Outcome:
        if step.noop:
            return Outcome.noop(step.summary)
        try:
            return await self._write_weights(
                params, step.before["route"], step.before["destinations"],
                [d["weight"] for d in step.after["destinations"]], step.before.get("resourceVersion"),
                "apply")
        except ActionError as exc:
            return Outcome.failure(str(exc), retryable=exc.retryable)

    async def verify(self, step: Step, target: Target, params: ShiftWeightsParams) -> Outcome:
        try:
            vs = await self._read(params)
            _, current = self._locate(vs, step.after["route"])
        except ActionError as exc:
            return Outcome.failure(f"verify: {exc}", retryable=exc.retryable)
        seen = [d.as_dict() for d in current]
        if seen != list(step.after["destinations"]):
            return Outcome.failure(f"verify: route weights are {seen}, expected {list(step.after['destinations'])}",
                                   found=seen)
        return Outcome.success("verify: route weights as planned", weights=seen)

    async def revert(self, step: Step, target: Target, params: ShiftWeightsParams) -> Outcome:
        """Restore exactly `step.before` (absent weights removed again), only from `step.after`."""
        if step.noop:
            return Outcome.noop("nothing was changed")
        try:
            return await self._write_weights(
                params, step.after["route"], step.after["destinations"],
                [d["weight"] for d in step.before["destinations"]], None, "revert")
        except ActionError as exc:
            return Outcome.failure(str(exc), retryable=exc.retryable)
