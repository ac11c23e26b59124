"""The http routes of an Istio VirtualService, shared by `istio.shift_weights` and the `istio` timeout sink."""
from __future__ import annotations

from typing import Any, Mapping

from core.outcome import PermanentError

GROUP, PLURAL = "networking.istio.io", "virtualservices"


def http_routes(vs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """spec.http of a VirtualService as read (empty when absent)."""
    routes: list[dict[str, Any]] = (vs.get("spec") or {}).get("http") or []
    return routes


def select_route(vs: Mapping[str, Any], route: str | None, match: int | None) -> int:
    """The index in spec.http of the route to use: by name (`route`), by index (`match`), or the first.

    Raises PermanentError when no route has that name or the index is out of range.
    """
    http = http_routes(vs)
    if route is not None:
        for index, candidate in enumerate(http):
            if candidate.get("name") == route:
                return index
        raise PermanentError(f"no http route named {route!r} (routes: {[r.get('name') for r in http]})")
    index = match or 0
    if index >= len(http):
        raise PermanentError(f"http route index {index} out of range ({len(http)} route(s))")
    return index
