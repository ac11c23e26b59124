"""Objects and client settings for the Kubernetes API emulator: a kubeconfig pointing at it, and the
Istio VirtualService shapes the lab seeds (used by the demo and the tests alike)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from lab.kube.emulator import KubeEmulator


def write_kubeconfig(path: Path, emulator: KubeEmulator) -> Path:
    """A kubeconfig pointing at the emulator (plain HTTP, no auth), for kubernetes.mode=kubeconfig."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": emulator.url}}],
        "users": [{"name": "tailguard", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tailguard"}}],
    }))
    return path


def kube_settings(kubeconfig: Path) -> dict[str, Any]:
    """The daemon's `kubernetes` settings section for a kubeconfig file."""
    return {"mode": "kubeconfig", "kubeconfig": str(kubeconfig)}


def virtual_service(name: str = "ranker", namespace: str = "serving", timeout: str | None = None,
                    api_version: str = "networking.istio.io/v1",
                    weights: Mapping[str, int] | None = None) -> dict[str, Any]:
    """A VirtualService with one http route named `primary`.

    Args:
        weights: Subset name -> weight; None routes everything to the host without subsets.
    """
    destinations: list[dict[str, Any]] = (
        [{"destination": {"host": name, "subset": subset}, "weight": weight} for subset, weight in weights.items()]
        if weights is not None else [{"destination": {"host": name}}])
    route: dict[str, Any] = {"name": "primary", "route": destinations}
    if timeout is not None:
        route["timeout"] = timeout
    return {"apiVersion": api_version, "kind": "VirtualService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"hosts": [name], "http": [route]}}


def destination_rule(name: str = "ranker", namespace: str = "serving",
                     subsets: Mapping[str, Mapping[str, str]] | None = None,
                     api_version: str = "networking.istio.io/v1") -> dict[str, Any]:
    """A DestinationRule for host `name` whose subsets select pods by label, as two Deployments
    of one model carry them (`version: v1`, `version: v2`): what the canary judge maps subsets to
    the version label of the mesh's series through.

    Args:
        subsets: Subset name -> its pod labels; default v1 and v2 by `version`.
    """
    chosen = subsets if subsets is not None else {"v1": {"version": "v1"}, "v2": {"version": "v2"}}
    return {"apiVersion": api_version, "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"host": name, "subsets": [{"name": subset, "labels": dict(labels)}
                                               for subset, labels in chosen.items()]}}


def route_weights(vs: Mapping[str, Any], route: str = "primary") -> dict[str, int]:
    """Subset -> weight of the named http route (a destination without a weight counts 0, a lone one 100)."""
    for http in vs.get("spec", {}).get("http", []):
        if http.get("name") == route:
            dests = http.get("route", [])
            if len(dests) == 1 and "weight" not in dests[0]:
                return {_subset(dests[0]): 100}
            return {_subset(d): int(d.get("weight", 0)) for d in dests}
    return {}


def route_timeout(vs: Mapping[str, Any], route: str = "primary") -> str | None:
    """The named http route's timeout as written (e.g. ``"2s"``), or None when unset."""
    for http in vs.get("spec", {}).get("http", []):
        if http.get("name") == route:
            timeout = http.get("timeout")
            return str(timeout) if timeout is not None else None
    return None


def _subset(destination: Mapping[str, Any]) -> str:
    dest = destination.get("destination", {})
    return str(dest.get("subset") or dest.get("host", ""))
