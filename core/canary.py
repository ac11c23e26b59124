"""Who is the stable and who the canary: read from an Istio VirtualService route's destinations,
their subsets mapped to the version label the metric series carry (through the DestinationRule's
subset labels, or an explicit map). Pure: the reading is the caller's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Destination:
    """One destination of the route: its subset, its weight, and the version its series carry."""

    subset: str
    weight: int
    version: str


@dataclass(frozen=True)
class CanaryRoles:
    """The stable (the destination with the most weight) and every other destination with weight."""

    stable: Destination
    canaries: tuple[Destination, ...]
    source: str  # where the roles were read: "serving/ranker route primary"

    def describe(self) -> str:
        canaries = ", ".join(f"{c.subset} ({c.version}) {c.weight}%" for c in self.canaries) or "none"
        return f"stable {self.stable.subset} ({self.stable.version}) {self.stable.weight}%, canaries {canaries}"


def canary_roles(virtual_service: Mapping[str, Any] | None, route: str | None,
                 destination_rule: Mapping[str, Any] | None, versions: Mapping[str, str] | None,
                 pod_label: str, source: str) -> CanaryRoles | str:
    """The roles, or why they cannot be told (a reason for the detection: never a shift).

    Args:
        route: the http route's name; None: the first route.
        versions: subset -> the version label value of its series (wins over the DestinationRule).
        pod_label: the DestinationRule subset label that names the version (`version`).
    """
    if virtual_service is None:
        return f"no VirtualService {source}"
    http = (virtual_service.get("spec") or {}).get("http") or []
    chosen = next((r for r in http if r.get("name") == route), None) if route is not None else (http[0] if http else None)
    if chosen is None:
        return f"VirtualService {source} has no http route {route!r}" if route else f"VirtualService {source} has no http route"
    dests: list[tuple[str, int]] = []
    for d in chosen.get("route") or []:
        subset = (d.get("destination") or {}).get("subset")
        if not subset:
            return f"VirtualService {source}: a destination without a subset cannot be told apart by version"
        dests.append((str(subset), int(d.get("weight", 100 if len(chosen.get("route") or []) == 1 else 0))))
    if len(dests) < 2:
        return f"VirtualService {source}: one destination, nothing to compare (not a canary)"
    total = sum(w for _, w in dests)
    if total != 100:
        return f"VirtualService {source}: weights sum to {total}, not 100; roles not read"
    subsets = {s.get("name"): s.get("labels") or {} for s in ((destination_rule or {}).get("spec") or {}).get("subsets") or []}
    found: list[Destination] = []
    for subset, weight in dests:
        version = (versions or {}).get(subset)
        if version is None:
            if subset not in subsets:
                return (f"subset {subset!r} of VirtualService {source} is not in the DestinationRule"
                        + ("" if destination_rule is not None else " (none found)") + " and no versions map names it")
            version = subsets[subset].get(pod_label)
            if version is None:
                return f"subset {subset!r} has no {pod_label!r} label in the DestinationRule"
        found.append(Destination(subset, weight, str(version)))
    ordered = sorted(found, key=lambda d: -d.weight)
    if ordered[0].weight == ordered[1].weight:
        return f"VirtualService {source}: no destination carries the most weight ({ordered[0].weight}% each)"
    return CanaryRoles(ordered[0], tuple(d for d in ordered[1:] if d.weight > 0), source)
