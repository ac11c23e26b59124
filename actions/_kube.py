"""Kubernetes I/O shared by every action and sink that reads or writes API objects.

Failures come back in the action taxonomy (`_kube_errors.api_error`); a write whose precondition
failed (409, or a failed JSON-patch `test`) raises `Conflict` for the compare-and-swap loop.

Every write of an action stamps the object with the step's effect key (annotation
`tailguard.io/decision: "<decision id>/<step index>"`, `mark_ops`), and every read reports the
stamp it found (`mark_of`): a decision resumed after a crash recognises a change of its own that
landed, instead of taking it for someone else's edit. Writes name tailguard as their field
manager (`FIELD_MANAGER`), so `metadata.managedFields` tells our changes from others'.

Objects someone else owns (Flagger, Argo Rollouts, GitOps) are refused before any write: readings
carry `_ownership.ownership_of(metadata)` and the compare-and-swap loop asks each reading
(`Swap.refusal`) right before it writes; plans refuse them already (actions/_ownership.py).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Mapping, cast

import aiohttp
from kubernetes_asyncio.client import CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from actions._compare_and_swap import Conflict
from actions.base import UNGUARDED, Actuator, Effect
from actions._kube_errors import api_error, is_precondition_failure, server_message
from core.outcome import PermanentError

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

REQUEST_TIMEOUT_SECONDS = 10.0
JSON_PATCH = "application/json-patch+json"
FIELD_MANAGER = "tailguard"  # names our writes in metadata.managedFields
DECISION_ANNOTATION = "tailguard.io/decision"
_DECISION_POINTER = "/metadata/annotations/" + DECISION_ANNOTATION.replace("~", "~0").replace("/", "~1")


def mark_of(annotations: Mapping[str, str] | None) -> dict[str, Any]:
    """What a read saw of our stamp, as journaled with the reading: whether the object has
    `metadata.annotations` at all (`annotated`), and the effect key of the write that stamped it (`by`)."""
    return {"annotated": annotations is not None, "by": (annotations or {}).get(DECISION_ANNOTATION)}


def marked_by(mark: Mapping[str, Any] | None, effect_key: str | None) -> bool:
    """Whether `mark` (from `mark_of`) is the stamp of the write for `effect_key`."""
    return effect_key is not None and mark is not None and mark.get("by") == effect_key


def stamp_note(mark: Mapping[str, Any] | None, effect_key: str | None) -> str:
    """For a verify message: says when the object carries this step's own stamp ("" otherwise)."""
    return f" (stamped {effect_key} by this step's write)" if marked_by(mark, effect_key) else ""


def mark_ops(mark: Mapping[str, Any] | None, effect_key: str | None) -> list[dict[str, Any]]:
    """JSON-patch ops that stamp the object with `effect_key` (none without a key).

    `mark` is what the guarded read saw: without annotations the whole map is added; with them,
    or when unknown (None), only our key (a wrong guess fails the patch, which re-reads).
    """
    if effect_key is None:
        return []
    if mark is not None and mark.get("annotated") is False:
        return [{"op": "add", "path": "/metadata/annotations", "value": {DECISION_ANNOTATION: effect_key}}]
    return [{"op": "add", "path": _DECISION_POINTER, "value": effect_key}]


def client(kube: "ApiClient | None", who: str) -> "ApiClient":
    """The shared client, or a PermanentError naming `who` needs it."""
    if kube is None:
        raise PermanentError(f"{who} needs a Kubernetes client (kubernetes.mode is off)")
    return kube


async def read(what: str, request: Awaitable[Any]) -> Any:
    """Await a read; any failure as the ActionError for `what` ("get configmaps ns/name")."""
    try:
        return await request
    except (ApiException, aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise api_error(exc, what) from exc


async def write(what: str, request: Awaitable[Any]) -> Any:
    """Await a guarded write; Conflict when its precondition failed, else as `read`."""
    try:
        return await request
    except ApiException as exc:
        if is_precondition_failure(exc):
            raise Conflict(server_message(exc)) from exc
        raise api_error(exc, what) from exc
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise api_error(exc, what) from exc


async def list_objects(kube: "ApiClient | None", who: str, *, group: str, version: str, plural: str,
                       namespace: str, timeout_seconds: float = REQUEST_TIMEOUT_SECONDS) -> list[dict[str, Any]]:
    """Every object of one resource in `namespace` (the HPAs of a namespace), as dicts; a named API
    group only (not the core group, whose path is /api/v1). Raises ActionError."""
    request = CustomObjectsApi(client(kube, who)).list_namespaced_custom_object(
        group, version, namespace, plural, _request_timeout=timeout_seconds)
    listed = await read(f"list {plural}.{group} in {namespace}", request)
    return [dict(item) for item in cast(dict[str, Any], listed).get("items") or []]


@dataclass(frozen=True)
class CustomObject:
    """One namespaced object of a named API group: GET it, or JSON-patch it. Custom objects (a
    VirtualService, an HTTPRoute) and built-in ones alike (apps/v1 Deployments, autoscaling/v2 HPAs):
    the generic client builds the same /apis/<group>/<version>/namespaces/... paths and keeps the
    objects as dicts. Core-group objects (ConfigMaps: /api/v1) are not served by it."""

    kube: "ApiClient | None"
    who: str  # who reads and writes it, named when there is no client
    group: str
    version: str
    plural: str
    namespace: str
    name: str
    timeout_seconds: float = REQUEST_TIMEOUT_SECONDS
    actuator: Actuator = UNGUARDED  # every patch passes it (`ActionDeps.actuator`: the daemon's door)

    def _what(self, verb: str) -> str:
        return f"{verb} {self.plural}.{self.group} {self.namespace}/{self.name}"

    def _api(self) -> CustomObjectsApi:
        return CustomObjectsApi(client(self.kube, self.who))

    async def get(self) -> dict[str, Any]:
        request = self._api().get_namespaced_custom_object(
            self.group, self.version, self.namespace, self.plural, self.name,
            _request_timeout=self.timeout_seconds)
        return cast(dict[str, Any], await read(self._what("get"), request))

    async def patch(self, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """Apply RFC 6902 `ops` (guarded by their `test` ops) through the door; Conflict when a test
        failed, `Refused` when the door said no (nothing sent)."""
        what = self._what("patch")

        async def send() -> Any:
            request = self._api().patch_namespaced_custom_object(
                self.group, self.version, self.namespace, self.plural, self.name, ops,
                field_manager=FIELD_MANAGER, _content_type=JSON_PATCH, _request_timeout=self.timeout_seconds)
            return await write(what, request)

        effect = Effect("kube.patch", what, timeout_seconds=self.timeout_seconds, data={"ops": ops})
        return cast(dict[str, Any], await self.actuator.write(effect, send))
