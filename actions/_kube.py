"""Kubernetes I/O shared by every action and sink that reads or writes API objects.

Failures come back in the action taxonomy (`_kube_errors.api_error`); a write whose precondition
failed (409, or a failed JSON-patch `test`) raises `Conflict` for the compare-and-swap loop.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, cast

import aiohttp
from kubernetes_asyncio.client import CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from actions._compare_and_swap import Conflict
from actions._kube_errors import api_error, is_precondition_failure, server_message
from core.outcome import PermanentError

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

REQUEST_TIMEOUT_SECONDS = 10.0
JSON_PATCH = "application/json-patch+json"


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


@dataclass(frozen=True)
class CustomObject:
    """One namespaced custom object (a VirtualService, an HTTPRoute): GET it, or JSON-patch it."""

    kube: "ApiClient | None"
    who: str  # who reads and writes it, named when there is no client
    group: str
    version: str
    plural: str
    namespace: str
    name: str
    timeout_seconds: float = REQUEST_TIMEOUT_SECONDS

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
        """Apply RFC 6902 `ops` (guarded by their `test` ops); Conflict when a test failed."""
        request = self._api().patch_namespaced_custom_object(
            self.group, self.version, self.namespace, self.plural, self.name, ops,
            _content_type=JSON_PATCH, _request_timeout=self.timeout_seconds)
        return cast(dict[str, Any], await write(self._what("patch"), request))
