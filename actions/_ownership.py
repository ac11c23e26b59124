"""Objects someone else owns, decided from their metadata alone (pure; no I/O).

A VirtualService, HTTPRoute, ConfigMap, Deployment or HorizontalPodAutoscaler that a
progressive-delivery, GitOps or autoscaling controller owns is not ours to edit: the controller
would put its own value back (a tug of war), or we would corrupt its rollout. Evidence, from `metadata`:

- `ownerReferences`: kind Canary of apiVersion flagger.app/* (Flagger); kind Rollout of
  argoproj.io/* (Argo Rollouts); kind ScaledObject of keda.sh/* (KEDA, on the HPA it made);
- the managers in `managedFields`: names starting with "flagger" (Flagger); "rollouts-controller",
  "argo-rollouts" (Argo Rollouts); "argocd-controller", "argocd-application-controller",
  "kustomize-controller", "helm-controller" (GitOps: Argo CD, Flux); "keda-operator" (KEDA). An
  entry for the status subresource only is not evidence: it manages status, not what we write;
- labels and annotations those controllers put on what they manage: Argo CD's
  `argocd.argoproj.io/tracking-id` annotation (annotation tracking) and `argocd.argoproj.io/instance`
  label, Flux's `kustomize.toolkit.fluxcd.io/name` and `helm.toolkit.fluxcd.io/name` labels (GitOps);
  KEDA's `scaledobject.keda.sh/name` label and `app.kubernetes.io/managed-by: keda-operator` (on the
  HPA of a ScaledObject). `app.kubernetes.io/instance` alone is not: Helm sets it too.

`app.kubernetes.io/managed-by: Helm` (or the manager "helm") is not: a Helm-installed object is fine
to edit unless a GitOps controller also manages it.

A policy may accept owners by name (`allowOwnedBy: [flagger, argo-rollouts, gitops]`).
Readings journal `ownership_of(...)`, a small copy of the metadata that the same functions accept.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Collection, Literal, Mapping

from pydantic import AfterValidator

from core.outcome import PermanentError

OwnerKey = Literal["flagger", "argo-rollouts", "gitops", "keda"]

_OWNER_NAMES: Mapping[str, str] = {"flagger": "Flagger", "argo-rollouts": "Argo Rollouts",
                                   "gitops": "a GitOps controller", "keda": "KEDA"}
_OWNER_REFERENCES: Mapping[str, tuple[str, str]] = {  # kind -> (apiVersion group prefix, owner)
    "Canary": ("flagger.app/", "flagger"),
    "Rollout": ("argoproj.io/", "argo-rollouts"),
    "ScaledObject": ("keda.sh/", "keda"),
}
_MANAGERS: Mapping[str, str] = {
    "rollouts-controller": "argo-rollouts", "argo-rollouts": "argo-rollouts",
    "argocd-controller": "gitops", "argocd-application-controller": "gitops",
    "kustomize-controller": "gitops", "helm-controller": "gitops", "keda-operator": "keda",
}
# Label or annotation key -> owner, whatever its value; and (key, value) pairs that name an owner.
_MARK_KEYS: Mapping[str, str] = {
    "argocd.argoproj.io/tracking-id": "gitops", "argocd.argoproj.io/instance": "gitops",
    "kustomize.toolkit.fluxcd.io/name": "gitops", "helm.toolkit.fluxcd.io/name": "gitops",
    "scaledobject.keda.sh/name": "keda",
}
_MARK_VALUES: Mapping[tuple[str, str], str] = {("app.kubernetes.io/managed-by", "keda-operator"): "keda"}


def _distinct(keys: tuple[OwnerKey, ...]) -> tuple[OwnerKey, ...]:
    if len(set(keys)) != len(keys):
        raise ValueError(f"allowOwnedBy names an owner twice: {list(keys)}")
    return keys


# The `allowOwnedBy` parameter of every action that writes Kubernetes objects: owners to write anyway.
AllowOwnedBy = Annotated[tuple[OwnerKey, ...], AfterValidator(_distinct)]


@dataclass(frozen=True)
class Owner:
    """Someone else who owns an object: `key` as `allowOwnedBy` names it, and the evidence."""

    key: str
    evidence: str  # "ownerReference Canary/ranker", "manager kustomize-controller"

    def __str__(self) -> str:
        return f"{_OWNER_NAMES[self.key]} ({self.evidence})"


def _manager_owner(manager: str) -> str | None:
    name = manager.lower()
    return "flagger" if name.startswith("flagger") else _MANAGERS.get(name)


def owners(metadata: Mapping[str, Any]) -> list[Owner]:
    """Every owner the metadata shows, ownerReferences first, each owner key once."""
    found: dict[str, Owner] = {}
    for ref in metadata.get("ownerReferences") or []:
        prefix, key = _OWNER_REFERENCES.get(str(ref.get("kind")), ("", ""))
        if key and str(ref.get("apiVersion", "")).startswith(prefix):
            found.setdefault(key, Owner(key, f"ownerReference {ref.get('kind')}/{ref.get('name')}"))
    for entry in metadata.get("managedFields") or []:
        managed_by = _manager_owner(str(entry.get("manager") or ""))
        if managed_by and entry.get("subresource") != "status":
            found.setdefault(managed_by, Owner(managed_by, f"manager {entry.get('manager')}"))
    for where in ("labels", "annotations"):
        for mark, value in (metadata.get(where) or {}).items():
            marked = _MARK_KEYS.get(mark) or _MARK_VALUES.get((mark, str(value)))
            if marked:
                found.setdefault(marked, Owner(marked, f"{where[:-1]} {mark}={value}"))
    return list(found.values())


def foreign_owner(metadata: Mapping[str, Any], allowed: Collection[str] = ()) -> Owner | None:
    """The decision: the first owner of the object that `allowed` does not accept; None: ours to write."""
    return next((o for o in owners(metadata) if o.key not in allowed), None)


def refusal(obj: str, metadata: Mapping[str, Any] | None, allowed: Collection[str] = ()) -> str | None:
    """Why `obj` ("VirtualService serving/ranker") must not be written, or None (also for unknown metadata)."""
    owner = foreign_owner(metadata or {}, allowed)
    if owner is None:
        return None
    return f"refused: {obj} is managed by {owner}; set allowOwnedBy to override"


def refuse_owned(obj: str, metadata: Mapping[str, Any] | None, allowed: Collection[str] = ()) -> None:
    """Raise the refusal as a PermanentError (never retried) when there is one."""
    why = refusal(obj, metadata, allowed)
    if why is not None:
        raise PermanentError(why)


def _when(entry: Mapping[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(entry["time"]))
    except (KeyError, TypeError, ValueError):
        return None


def last_writer(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Who wrote the object most recently, as managedFields tell: the entry with the latest time
    (manager, operation, time), not counting the status subresource; None when they do not say."""
    timed = [(when, entry) for entry in (metadata or {}).get("managedFields") or []
             if entry.get("subresource") != "status" and entry.get("manager") and (when := _when(entry))]
    if not timed:
        return None
    latest = max(timed, key=lambda pair: pair[0])[1]
    return {k: latest.get(k) for k in ("manager", "operation", "time")}


def changed_by_note(metadata: Mapping[str, Any] | None) -> str:
    """For a verify message: who changed the object last, when managedFields tell ("" otherwise)."""
    entry = last_writer(metadata)
    if entry is None:
        return ""
    return f"; last changed by {entry['manager']} ({entry.get('operation') or 'write'} at {entry['time']})"


def ownership_of(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The part of `metadata` the decisions read, small enough to journal with a reading."""
    slim: dict[str, Any] = {
        "ownerReferences": [{k: r.get(k) for k in ("apiVersion", "kind", "name")}
                            for r in metadata.get("ownerReferences") or []],
        "managedFields": [{k: e.get(k) for k in ("manager", "operation", "time", "subresource") if e.get(k)}
                          for e in metadata.get("managedFields") or []],
    }
    for where in ("labels", "annotations"):  # only the marks the decision reads
        marks = {k: v for k, v in (metadata.get(where) or {}).items()
                 if k in _MARK_KEYS or (k, str(v)) in _MARK_VALUES}
        if marks:
            slim[where] = marks
    return slim
