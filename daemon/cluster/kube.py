"""Kubernetes edges of the daemon: the API client from settings, Events, and EndpointSlice discovery.

Actions get these through ActionDeps (`kube`, `record_event`, `endpoints`); nothing here decides.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import structlog
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api, DiscoveryV1Api

from actions.base import Replicas, static_endpoints
from core.outcome import PermanentError
from core.target import ServiceRef, Target
from daemon.common.config import KubernetesSettings

if TYPE_CHECKING:
    from policies.loader import LoadedPolicy

log = structlog.get_logger("tailguard.kube")

COMPONENT = "tailguard"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# A core/v1 Event message is shown whole by `kubectl describe`; keep it readable.
MAX_EVENT_MESSAGE_CHARS = 1024


class KubeConfigError(Exception):
    """kubernetes.mode says to use a cluster, but no usable configuration was found."""


async def create_api_client(settings: KubernetesSettings) -> ApiClient | None:
    """The kubernetes_asyncio ApiClient for `settings.mode`; None when mode is `off`.

    Args:
        settings: in-cluster (service account), kubeconfig (file and context) or off.

    Returns:
        A client to close with `await client.close()`, or None.

    Raises:
        KubeConfigError: the in-cluster environment or kubeconfig could not be loaded.
    """
    if settings.mode == "off":
        return None
    configuration = Configuration()
    try:
        if settings.mode == "in-cluster":
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            await kube_config.load_kube_config(
                config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                context=settings.context, client_configuration=configuration, persist_config=False)
    except (kube_config.ConfigException, OSError) as exc:
        raise KubeConfigError(f"kubernetes.mode={settings.mode}: {exc}") from exc
    return ApiClient(configuration=configuration)


def identity() -> str:
    """This replica's name in Leases and Events: POD_NAME (Downward API), else hostname_pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def _rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def involved_object(policy: "LoadedPolicy") -> dict[str, str] | None:
    """What an Event is about: the target's Triton Service when the policy names one; otherwise
    this daemon's own Pod (POD_NAME / POD_NAMESPACE from the Downward API, as the Helm chart sets
    them); None when neither is known (the Event is then skipped, and logged)."""
    service = policy.target.triton_service
    if service is not None:
        return {"apiVersion": "v1", "kind": "Service", "namespace": service.namespace,
                "name": service.name}
    pod, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if pod and namespace:
        return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod}
    return None


def event_body(policy: "LoadedPolicy", reason: str, message: str, warning: bool, instance: str,
               now: float) -> dict[str, Any] | None:
    """A core/v1 Event for `kubectl describe` of the involved object; None when nothing fits."""
    involved = involved_object(policy)
    if involved is None:
        return None
    stamp = _rfc3339(now)
    text = f"[{policy.name} -> {policy.target.model}] {message}"
    if len(text) > MAX_EVENT_MESSAGE_CHARS:
        text = text[: MAX_EVENT_MESSAGE_CHARS - 3] + "..."
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{secrets.token_hex(8)}",
                     "namespace": involved["namespace"],
                     "labels": {"app.kubernetes.io/managed-by": COMPONENT}},
        "involvedObject": involved,
        "reason": reason,
        "message": text,
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "action": reason,
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
    }


EventRecorder = Callable[..., Awaitable[None]]


def event_recorder(api: ApiClient, instance: str, clock: Callable[[], float]) -> EventRecorder:
    """`record_event(policy=..., reason=..., message=..., warning=...)` creating a core/v1 Event.

    Errors propagate: the executor records them as a fault and carries on.
    """

    async def record_event(*, policy: "LoadedPolicy", reason: str, message: str, warning: bool) -> None:
        body = event_body(policy, reason, message, warning, instance, clock())
        if body is None:
            log.info("no object to attach the event to (no triton.service, no POD_NAME/POD_NAMESPACE)",
                     reason=reason, event_message=message)
            return
        await CoreV1Api(api).create_namespaced_event(body["metadata"]["namespace"], body)

    return record_event


def _port_matches(port: Any, ref: ServiceRef) -> bool:
    wanted: int | str = ref.port
    if isinstance(wanted, str) and not wanted.isdigit():
        return bool(port.name == wanted)
    return bool(port.port == int(wanted) or port.name == str(wanted))


def _host(address: str) -> str:
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:  # FQDN address type
        return address


def ready_urls(slices: list[Any], ref: ServiceRef) -> list[str]:
    """`scheme://address:port` of every ready endpoint in `slices`, sorted and de-duplicated.

    Ready follows the EndpointSlice API: `ready: false` and terminating endpoints are left out;
    an absent `ready` is "unknown", which the API asks consumers to read as ready.
    """
    urls = set()
    for eps in slices:
        port = next((p for p in (eps.ports or []) if _port_matches(p, ref)), None)
        if port is None or port.port is None:
            log.warning("EndpointSlice has no port matching the target", slice=eps.metadata.name,
                        wanted=ref.port, ports=[(p.name, p.port) for p in (eps.ports or [])])
            continue
        for ep in eps.endpoints or []:
            cond = ep.conditions
            if cond is not None and (cond.ready is False or cond.terminating is True):
                continue
            for address in ep.addresses or []:
                urls.add(f"{ref.scheme}://{_host(address)}:{port.port}")
    return sorted(urls)


async def endpoints_from_slices(api: ApiClient, ref: ServiceRef) -> list[str]:
    """Ready Triton base URLs of a Service, from its discovery.k8s.io/v1 EndpointSlices."""
    result = await DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        ref.namespace, label_selector=f"{SERVICE_NAME_LABEL}={ref.name}")
    return ready_urls(list(result.items or []), ref)


def endpoints_resolver(api: ApiClient | None) -> Callable[[Target], Awaitable[list[str]]]:
    """deps.endpoints: EndpointSlices when the target names a Service and a client exists, else static."""

    async def endpoints(target: Target) -> list[str]:
        if target.triton_service is not None:
            if api is None:
                raise PermanentError(f"{target.key}: triton.service needs kubernetes.mode in-cluster "
                                   "or kubeconfig")
            return await endpoints_from_slices(api, target.triton_service)
        return await static_endpoints(target)

    return endpoints


def replica_urls(slices: list[Any], ref: ServiceRef) -> Replicas:
    """Every endpoint of `slices` as `scheme://address:port`, ready and not ready (terminating ones
    are leaving and left out), each sorted: the replicas an all-or-nothing rollback counts."""
    ready: set[str] = set()
    not_ready: set[str] = set()
    for eps in slices:
        port = next((p for p in (eps.ports or []) if _port_matches(p, ref)), None)
        if port is None or port.port is None:
            continue  # warned about by ready_urls
        for ep in eps.endpoints or []:
            cond = ep.conditions
            if cond is not None and cond.terminating is True:
                continue
            into = not_ready if cond is not None and cond.ready is False else ready
            into.update(f"{ref.scheme}://{_host(address)}:{port.port}" for address in ep.addresses or [])
    return Replicas(tuple(sorted(ready)), tuple(sorted(not_ready - ready)))


def replicas_resolver(api: ApiClient | None) -> Callable[[Target], Awaitable[Replicas]]:
    """deps.replicas: every endpoint of a Service's EndpointSlices, ready or not, when the target
    names one; else the static endpoints (all counted ready: reading them tells)."""

    async def replicas(target: Target) -> Replicas:
        ref = target.triton_service
        if ref is not None:
            if api is None:
                raise PermanentError(f"{target.key}: triton.service needs kubernetes.mode in-cluster or kubeconfig")
            result = await DiscoveryV1Api(api).list_namespaced_endpoint_slice(
                ref.namespace, label_selector=f"{SERVICE_NAME_LABEL}={ref.name}")
            return replica_urls(list(result.items or []), ref)
        return Replicas(tuple(await static_endpoints(target)))

    return replicas
