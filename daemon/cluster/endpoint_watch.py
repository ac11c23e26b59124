"""EndpointSlice watches: which Triton replicas of a target's Service just became ready.

A new or restarted Triton pod loads the newest model version from its repository, so it serves
the version a rollback pinned away until the pin reconciler reaches it. Its periodic pass
(`pinReconcileIntervalSeconds`) is the backstop; this watch is the fast path: one watch per
Service the policies name (list, then watch from the list's resourceVersion with bookmarks, as
client-go's reflector does), and an endpoint that turns ready, new or back after a restart (ready
false, then true), is handed to `on_ready` at once.

The watch resumes from the last resourceVersion it saw (an event's or a bookmark's) when the
server ends a stream; on 410 Gone (the version was compacted away) or an error it lists again,
and an endpoint that turned ready meanwhile is reported then. Nothing here decides or acts.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import aiohttp
import structlog
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiClient, DiscoveryV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from core.target import ServiceRef
from daemon.cluster.kube import SERVICE_NAME_LABEL, ready_urls
from daemon.common.lifecycle import Spawn, plain_spawn, wait_or_stop
from daemon.common.metrics import Metrics

log = structlog.get_logger("tailguard.endpoints")

WATCH_TIMEOUT_SECONDS = 300
"""Each watch request asks the server to end it after this (then it resumes from the last version)."""
MAX_BACKOFF_SECONDS = 30.0

OnReady = Callable[[ServiceRef, list[str]], None]


@dataclass
class _ServiceWatch:
    """What one Service's watch knows: its slices by name and the ready URLs last reported."""

    ref: ServiceRef
    slices: dict[str, Any] = field(default_factory=dict)
    ready: set[str] = field(default_factory=set)
    resource_version: str | None = None


class EndpointWatch:
    """Watches the EndpointSlices of every Service `services()` names; calls `on_ready(ref, urls)`
    with the endpoints that became ready since the last look (never for those ready at the first
    list: the periodic pass covers those).

    Args:
        api: The Kubernetes client.
        services: The Services to watch now (re-read every `resync_seconds`; a policy reload
            adds or drops watches).
        on_ready: Called (on the event loop, must not block) with newly ready base URLs.
        metrics: Watch failures count as faults under `endpoint_watch`.
        resync_seconds: How often the set of Services is compared with the running watches.
    """

    def __init__(self, api: ApiClient, services: Callable[[], Iterable[ServiceRef]], on_ready: OnReady,
                 metrics: Metrics, resync_seconds: float = 2.0) -> None:
        self._api = api
        self._services = services
        self._on_ready = on_ready
        self._metrics = metrics
        self._resync = resync_seconds
        self._tasks: dict[ServiceRef, asyncio.Task[None]] = {}
        self.spawn: Spawn = plain_spawn  # the service hands the supervisor's: a crash is counted and logged
        self.events = 0  # watch events seen (tests)
        self.lists = 0  # lists made (tests: a 410 or an error lists again)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                wanted = set(self._services())
                for ref in [r for r in self._tasks if r not in wanted or self._tasks[r].done()]:
                    self._tasks.pop(ref).cancel()
                for ref in wanted - set(self._tasks):
                    self._tasks[ref] = self.spawn(f"endpoints-{ref.namespace}/{ref.name}", self._follow(ref, stop))
                await wait_or_stop(stop, self._resync)
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            self._tasks.clear()

    async def _follow(self, ref: ServiceRef, stop: asyncio.Event) -> None:
        state = _ServiceWatch(ref)
        backoff, listed_once = 1.0, False
        while not stop.is_set():
            try:
                if state.resource_version is None:
                    await self._list(state, report=listed_once)
                    listed_once = True
                await self._watch(state)
                backoff = 1.0
            except ApiException as exc:
                if exc.status == 410:  # too old: list again, from now
                    log.info("endpoint watch expired; listing again", service=f"{ref.namespace}/{ref.name}")
                    state.resource_version = None
                    continue
                await self._failed(state, f"HTTP {exc.status} {exc.reason}")
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as exc:
                await self._failed(state, f"{type(exc).__name__}: {exc}")
            else:
                continue
            await wait_or_stop(stop, backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    async def _failed(self, state: _ServiceWatch, error: str) -> None:
        self._metrics.faults.labels("endpoint_watch").inc()
        log.warning("endpoint watch failed; listing again after a pause (the periodic pin pass goes on)",
                    service=f"{state.ref.namespace}/{state.ref.name}", error=error)
        state.resource_version = None

    async def _list(self, state: _ServiceWatch, report: bool) -> None:
        ref = state.ref
        result = await DiscoveryV1Api(self._api).list_namespaced_endpoint_slice(
            ref.namespace, label_selector=f"{SERVICE_NAME_LABEL}={ref.name}")
        self.lists += 1
        state.slices = {s.metadata.name: s for s in result.items or []}
        state.resource_version = result.metadata.resource_version
        self._look(state, report)

    async def _watch(self, state: _ServiceWatch) -> None:
        """One watch request from the state's resourceVersion until the server ends it."""
        ref = state.ref
        w = watch.Watch()
        try:
            async for event in w.stream(DiscoveryV1Api(self._api).list_namespaced_endpoint_slice, ref.namespace,
                                        label_selector=f"{SERVICE_NAME_LABEL}={ref.name}",
                                        resource_version=state.resource_version, allow_watch_bookmarks=True,
                                        timeout_seconds=WATCH_TIMEOUT_SECONDS,
                                        _request_timeout=WATCH_TIMEOUT_SECONDS + 30):
                self.events += 1
                kind, obj = event["type"], event["object"]
                if kind != "BOOKMARK":
                    name = obj.metadata.name
                    if kind == "DELETED":
                        state.slices.pop(name, None)
                    else:
                        state.slices[name] = obj
                    self._look(state, report=True)
                if w.resource_version:
                    state.resource_version = w.resource_version
        finally:
            await w.close()

    def _look(self, state: _ServiceWatch, report: bool) -> None:
        ready = set(ready_urls(list(state.slices.values()), state.ref))
        new = sorted(ready - state.ready)
        state.ready = ready
        if new and report:
            log.info("endpoints became ready", service=f"{state.ref.namespace}/{state.ref.name}", urls=new)
            self._on_ready(state.ref, new)
