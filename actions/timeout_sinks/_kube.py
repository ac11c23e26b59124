"""Shared Kubernetes I/O of the custom-resource sinks: GET and guarded JSON patch."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
from kubernetes_asyncio.client import CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from actions.timeout_sinks.base import SinkConflict, api_error, is_precondition_failure, server_message
from core.outcome import PermanentError

if TYPE_CHECKING:
    from actions.base import ActionDeps

REQUEST_TIMEOUT_SECONDS = 10.0


def custom_api(deps: "ActionDeps", kind: str) -> CustomObjectsApi:
    if deps.kube is None:
        raise PermanentError(f"the {kind} timeout sink needs a Kubernetes client (kubernetes.mode is off)")
    return CustomObjectsApi(deps.kube)


async def get_custom(deps: "ActionDeps", kind: str, group: str, version: str, namespace: str,
                     plural: str, name: str) -> dict[str, Any]:
    try:
        return await custom_api(deps, kind).get_namespaced_custom_object(
            group, version, namespace, plural, name, _request_timeout=REQUEST_TIMEOUT_SECONDS)
    except (ApiException, aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise api_error(exc, f"get {plural}.{group} {namespace}/{name}") from exc


async def patch_custom(deps: "ActionDeps", kind: str, group: str, version: str, namespace: str,
                       plural: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        return await custom_api(deps, kind).patch_namespaced_custom_object(
            group, version, namespace, plural, name, ops,
            _content_type="application/json-patch+json", _request_timeout=REQUEST_TIMEOUT_SECONDS)
    except ApiException as exc:
        if is_precondition_failure(exc):
            raise SinkConflict(server_message(exc)) from exc
        raise api_error(exc, f"patch {plural}.{group} {namespace}/{name}") from exc
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise api_error(exc, f"patch {plural}.{group} {namespace}/{name}") from exc
