"""What the API server and the controller manager do to Deployments and HorizontalPodAutoscalers
beyond schema validation, as far as `kubernetes.scale` depends on it (pure functions; the emulator
calls them).

- Defaulting (apps/v1 and autoscaling/v2 defaults): a Deployment's `spec.replicas` is 1 when absent,
  an HPA's `spec.minReplicas` is 1 when absent: a stored object always has both.
- Validation the OpenAPI schema cannot say (pkg/apis/autoscaling/validation): `minReplicas` >= 1,
  `maxReplicas` >= `minReplicas`.
- The HPA controller's floor and ceiling: a Deployment an HPA scales (its `scaleTargetRef`) gets
  `replicas = min(max(current, minReplicas), maxReplicas)`. The real controller computes the count
  from metrics every sync period (15 s) and then clamps it; the emulator has no metrics, so it keeps
  the current count and applies the clamp right after any write to the HPA or the Deployment, as the
  manager `kube-controller-manager` (its field manager in managedFields).
"""
from __future__ import annotations

from typing import Any, Mapping

HPA_MANAGER = "kube-controller-manager"


def apply_defaults(kind: str, obj: dict[str, Any]) -> None:
    """Fill the defaults the API server fills on every create and update."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind == "Deployment" and spec.get("replicas") is None:
        spec["replicas"] = 1
    if kind == "HorizontalPodAutoscaler" and spec.get("minReplicas") is None:
        spec["minReplicas"] = 1


def semantic_errors(kind: str, obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for what the schema lets through and the API server refuses."""
    if kind != "HorizontalPodAutoscaler":
        return []
    spec = obj.get("spec") or {}
    low, high = spec.get("minReplicas"), spec.get("maxReplicas")
    errors: list[tuple[str, str]] = []
    if isinstance(low, int) and low < 1:
        errors.append(("spec.minReplicas", f"Invalid value: {low}: must be greater than or equal to 1"))
    if isinstance(low, int) and isinstance(high, int) and high < low:
        errors.append(("spec.maxReplicas", f"Invalid value: {high}: must be greater than or equal to `minReplicas`"))
    return errors


def scales(hpa: Mapping[str, Any], deployment: Mapping[str, Any]) -> bool:
    """Whether `hpa` (in the same namespace) scales `deployment`."""
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    return (ref.get("kind") == "Deployment" and str(ref.get("apiVersion", "")).startswith("apps/")
            and ref.get("name") == (deployment.get("metadata") or {}).get("name"))


def clamped_replicas(hpa: Mapping[str, Any], replicas: int) -> int:
    """The count the HPA controller keeps a Deployment of `replicas` at (no metrics: the current one)."""
    spec = hpa.get("spec") or {}
    return min(max(replicas, int(spec.get("minReplicas") or 1)), int(spec.get("maxReplicas") or replicas))
