"""Reads one Kubernetes custom object for a detector that needs what the cluster says (the canary
judge reads the VirtualService and DestinationRule): `detectors.base.ClusterReader`."""
from __future__ import annotations

from typing import Any, Mapping, cast

from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException


class KubeObjectReader:
    """GET a namespaced custom object; None when it does not exist (404); anything else raises."""

    def __init__(self, kube: ApiClient, timeout_seconds: float = 5.0) -> None:
        self._api = CustomObjectsApi(kube)
        self._timeout = timeout_seconds

    async def get(self, group: str, version: str, plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            found = await self._api.get_namespaced_custom_object(group, version, namespace, plural, name,
                                                                _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(Mapping[str, Any], found)
