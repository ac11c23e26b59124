"""`kubernetes.scale`: raise the replica count of one Deployment, or its HPA's floor.

Where no HorizontalPodAutoscaler scales the Deployment, the action raises `spec.replicas`; where one
does, the HPA owns the count (it would put back its own), so the action raises the HPA's
`spec.minReplicas` and the HPA controller scales the Deployment up to it
(`replicas = max(current, minReplicas)`, within `maxReplicas`, which the action never raises).
It only ever raises: asking for fewer replicas than there are is a noop. Revert restores exactly
the value it changed.

Planning is pure (`plan_scale`); every write is one compare-and-swap (actions/_compare_and_swap.py)
of that one integer: a JSON patch guarded by `test` ops on metadata.resourceVersion and the old
value, stamped with the step's effect key, sent through the door (`ActionDeps.actuator`).

Refused, before any write (plan, and right before each write): a Deployment or HPA that a GitOps
controller owns (Argo CD, Flux: its value would be synced back), and an HPA that KEDA made for a
ScaledObject (KEDA rewrites its minReplicas from the ScaledObject), unless `allowOwnedBy` names that
owner (actions/_ownership.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from actions._compare_and_swap import compare_and_swap
from actions._kube import CustomObject, list_objects, mark_of, mark_ops, marked_by, stamp_note
from actions._ownership import AllowOwnedBy, changed_by_note, ownership_of, refusal, refuse_owned
from actions.base import ActionDeps, ActionParams, Step
from core.outcome import ActionError, Outcome, PermanentError
from core.signal import Signal
from core.target import Target

KIND = "kubernetes.scale"
Field_ = Literal["replicas", "minReplicas"]
# (group, version, plural, kind) of the two objects the action reads and writes.
DEPLOYMENTS = ("apps", "v1", "deployments", "Deployment")
HPAS = ("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")


class DeploymentRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)


class ScaleParams(ActionParams):
    """Which Deployment, how many replicas (`to`: at least that many; `by`: that many more than it
    has), and the most it may ever get (`max`: `to`/`by` are capped there)."""

    deployment: DeploymentRef
    to: int | None = Field(None, ge=1)
    by: int | None = Field(None, ge=1)
    max_replicas: int = Field(alias="max", ge=1, le=10_000)
    max_conflict_retries: int = Field(3, ge=0, le=10, alias="maxConflictRetries")
    request_timeout_seconds: float = Field(10.0, gt=0, le=120, alias="requestTimeoutSeconds")
    allow_owned_by: AllowOwnedBy = Field((), alias="allowOwnedBy")

    @model_validator(mode="after")
    def _one_mode(self) -> "ScaleParams":
        if (self.to is None) == (self.by is None):
            raise ValueError("give exactly one of 'to' (replicas) and 'by' (more replicas)")
        if self.to is not None and self.to > self.max_replicas:
            raise ValueError(f"'to' ({self.to}) is more than 'max' ({self.max_replicas})")
        return self


# ---- pure decisions -------------------------------------------------------------------------


def _spec_int(obj: Mapping[str, Any], name: str) -> int:
    value = (obj.get("spec") or {}).get(name)
    return int(value) if isinstance(value, int) else 1  # the API server's default for both fields


def scaling_hpa(deployment: Mapping[str, Any], hpas: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The HPA that scales `deployment` (its scaleTargetRef), or None. PermanentError for two."""
    name = (deployment.get("metadata") or {}).get("name")
    found = [h for h in hpas if ((h.get("spec") or {}).get("scaleTargetRef") or {}).get("kind") == "Deployment"
             and ((h.get("spec") or {}).get("scaleTargetRef") or {}).get("name") == name]
    if len(found) > 1:
        names = sorted(str((h.get("metadata") or {}).get("name")) for h in found)
        raise PermanentError(f"Deployment {name} is scaled by more than one HPA ({', '.join(names)})")
    return found[0] if found else None


def wanted_replicas(current: int, params: ScaleParams) -> int:
    """The count asked for, capped at `max` (it may be below `current`: then nothing is raised)."""
    asked = params.to if params.to is not None else current + (params.by or 0)
    return min(asked, params.max_replicas)


def plan_scale(deployment: Mapping[str, Any], hpas: Sequence[Mapping[str, Any]], params: ScaleParams) -> Step:
    """The Step for a Deployment and the HPAs of its namespace, as read: the one integer to raise
    (`before`/`after`: object, field, value), noop when it is already high enough.

    Raises PermanentError when a change is due but someone else owns the object to write."""
    meta = deployment.get("metadata") or {}
    replicas = _spec_int(deployment, "replicas")
    wanted = wanted_replicas(replicas, params)
    hpa = scaling_hpa(deployment, hpas)
    obj, field, note = deployment, "replicas", ""
    value, new = replicas, max(replicas, wanted)
    if hpa is not None:
        obj, field = hpa, "minReplicas"
        ceiling = _spec_int(hpa, "maxReplicas")
        value = _spec_int(hpa, "minReplicas")
        new = max(value, min(wanted, ceiling))
        note = f" (HPA {(hpa.get('metadata') or {}).get('name')} owns the count" + (
            f"; capped at its maxReplicas {ceiling})" if wanted > ceiling else ")")
    obj_meta = obj.get("metadata") or {}
    ref = {"kind": obj.get("kind", "Deployment" if hpa is None else "HorizontalPodAutoscaler"),
           "namespace": obj_meta.get("namespace"), "name": obj_meta.get("name")}
    noop = new == value
    where = f"{ref['kind']} {ref['namespace']}/{ref['name']}"
    if not noop:
        refuse_owned(where, obj_meta, params.allow_owned_by)
        if hpa is not None:  # the Deployment's own owner would fight the HPA's scaling too
            refuse_owned(f"Deployment {meta.get('namespace')}/{meta.get('name')}", meta, params.allow_owned_by)
    before = {"object": ref, "field": field, "value": value, "replicas": replicas,
              "resourceVersion": obj_meta.get("resourceVersion"), "mark": mark_of(obj_meta.get("annotations")),
              "owner": ownership_of(obj_meta)}
    after = {"object": ref, "field": field, "value": new}
    summary = f"{where} {field}: " + (f"already {value} (asked {wanted})" if noop else f"{value} -> {new}") + note
    return Step(action=KIND, target=f"{meta.get('namespace')}/{meta.get('name')}", summary=summary,
                before=before, after=after, noop=noop)


def count_patch(reading: "CountReading", field: str, wanted: int) -> list[dict[str, Any]]:
    """An RFC 6902 patch: `test` the resourceVersion and the old value, then set the new one."""
    path = f"/spec/{field}"
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": reading.resource_version}]
    if reading.present:
        ops.append({"op": "test", "path": path, "value": reading.value})
    return ops + [{"op": "add", "path": path, "value": wanted}]


# ---- I/O ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CountReading:
    """One read of the integer: the object's resourceVersion, the value (1 when absent: `present`
    False), our stamp (`_kube.mark_of`) and who else owns it (`_ownership.ownership_of`)."""

    resource_version: str
    value: int
    present: bool = True
    mark: Mapping[str, Any] | None = None
    owner: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any], field: str) -> "CountReading":
        meta = obj.get("metadata") or {}
        present = isinstance((obj.get("spec") or {}).get(field), int)
        return cls(str(meta.get("resourceVersion")), _spec_int(obj, field), present,
                   mark_of(meta.get("annotations")), ownership_of(meta))


class Count:
    """One replica count (a Deployment's replicas, an HPA's minReplicas) as a compare-and-swap value
    (actions._compare_and_swap.Swap)."""

    def __init__(self, obj: CustomObject, kind: str, field: str, effect_key: str | None,
                 allowed: Sequence[str] = ()) -> None:
        self._obj = obj
        self._kind = kind
        self.what = field  # the value's word, and its key in the journal data
        self._effect_key = effect_key
        self._allowed = allowed

    async def read(self) -> CountReading:
        return CountReading.of(await self._obj.get(), self.what)

    def value(self, reading: CountReading) -> int:
        return reading.value

    def where(self, reading: CountReading) -> str:
        return f"{self._kind} {self._obj.namespace}/{self._obj.name}"

    def show(self, value: int) -> str:
        return str(value)

    def ours(self, reading: CountReading) -> bool:
        return marked_by(reading.mark, self._effect_key)

    def refusal(self, reading: CountReading) -> str | None:
        return refusal(f"{self._kind} {self._obj.namespace}/{self._obj.name}", reading.owner, self._allowed)

    async def write(self, reading: CountReading, wanted: int) -> Mapping[str, Any]:
        written = await self._obj.patch(count_patch(reading, self.what, wanted)
                                        + mark_ops(reading.mark, self._effect_key))
        return {"resourceVersion": (written.get("metadata") or {}).get("resourceVersion")}


class Scale:
    """The `kubernetes.scale` action (see ScaleParams)."""

    kind: ClassVar[str] = KIND
    Params: ClassVar[type[ActionParams]] = ScaleParams
    advisory: ClassVar[bool] = False

    def __init__(self, deps: ActionDeps) -> None:
        self._deps = deps

    def _object(self, params: ScaleParams, kind: str, name: str) -> CustomObject:
        group, version, plural, _ = DEPLOYMENTS if kind == "Deployment" else HPAS
        return CustomObject(self._deps.kube, KIND, group=group, version=version, plural=plural,
                            namespace=params.deployment.namespace, name=name,
                            timeout_seconds=params.request_timeout_seconds, actuator=self._deps.actuator)

    def _deployment(self, params: ScaleParams) -> CustomObject:
        return self._object(params, "Deployment", params.deployment.name)

    async def observe(self, target: Target, params: ScaleParams) -> Mapping[str, Any]:
        group, version, plural, _ = HPAS
        hpas = await list_objects(self._deps.kube, KIND, group=group, version=version, plural=plural,
                                  namespace=params.deployment.namespace,
                                  timeout_seconds=params.request_timeout_seconds)
        return {"deployment": await self._deployment(params).get(), "hpas": hpas}

    def plan(self, target: Target, params: ScaleParams, observed: Mapping[str, Any], signal: Signal) -> Step:
        return plan_scale(observed["deployment"], observed["hpas"], params)

    def _count(self, step: Step, params: ScaleParams) -> Count:
        ref = step.before["object"]
        return Count(self._object(params, ref["kind"], ref["name"]), ref["kind"], step.before["field"],
                     step.effect_key, params.allow_owned_by)

    async def apply(self, step: Step, target: Target, params: ScaleParams) -> Outcome:
        if step.noop:
            return Outcome.noop(step.summary)
        before = step.before
        # The first try trusts what plan saw; the `test` ops check it server-side.
        seen = None if before.get("resourceVersion") is None else CountReading(
            str(before["resourceVersion"]), int(before["value"]), True, before.get("mark"), before.get("owner"))
        return await compare_and_swap(self._count(step, params), expected=int(before["value"]),
                                      wanted=int(step.after["value"]), purpose="apply",
                                      max_retries=params.max_conflict_retries, seen=seen)

    async def verify(self, step: Step, target: Target, params: ScaleParams) -> Outcome:
        """OK when the value is as planned and the Deployment has at least that many replicas (an
        HPA floor the controller has not applied yet is a retryable failure)."""
        wanted, field, ref = int(step.after["value"]), step.after["field"], step.after["object"]
        try:
            obj = await self._object(params, ref["kind"], ref["name"]).get()
            deployment = obj if ref["kind"] == "Deployment" else await self._deployment(params).get()
        except ActionError as exc:
            return Outcome.failure(f"verify: {exc}", retryable=exc.retryable)
        found, replicas = _spec_int(obj, field), _spec_int(deployment, "replicas")
        if found != wanted:
            return Outcome.failure(f"verify: {ref['kind']} {ref['name']} {field} is {found}, expected {wanted}"
                                   f"{changed_by_note(obj.get('metadata'))}", retryable=False, found=found)
        if replicas < wanted:
            return Outcome.failure(f"verify: HPA floor {wanted} set, Deployment {params.deployment.name} still "
                                   f"at {replicas} replicas (the HPA controller has not scaled it yet)",
                                   retryable=True, replicas=replicas)
        mark = mark_of((obj.get("metadata") or {}).get("annotations"))
        return Outcome.success(f"verify: {field} {wanted}, Deployment at {replicas}{stamp_note(mark, step.effect_key)}",
                               **{field: wanted, "replicas": replicas, "ours": marked_by(mark, step.effect_key)})

    async def revert(self, step: Step, target: Target, params: ScaleParams) -> Outcome:
        """Restore exactly `step.before`'s value, only from `step.after`'s (never over someone else's)."""
        if step.noop:
            return Outcome.noop("nothing was changed")
        return await compare_and_swap(self._count(step, params), expected=int(step.after["value"]),
                                      wanted=int(step.before["value"]), purpose="revert",
                                      max_retries=params.max_conflict_retries)

    async def preconditions(self, step: Step, target: Target, params: ScaleParams) -> Outcome:
        """For a resumed decision (actions.base.Preconditions): OK while the value is still the planned
        `before` or already the `after` (the step landed); FAILED when someone else changed it."""
        ref, field = step.before["object"], step.before["field"]
        try:
            found = CountReading.of(await self._object(params, ref["kind"], ref["name"]).get(), field).value
        except ActionError:
            return Outcome.success("preconditions: not readable now; apply deals with it")
        if found in (int(step.before["value"]), int(step.after["value"])):
            return Outcome.success(f"preconditions: {field} is {found}, as planned")
        return Outcome.failure(f"preconditions: {ref['kind']} {ref['name']} {field} is {found} since the plan "
                               f"(planned from {step.before['value']})", retryable=False, found=found)
