"""One builder from settings to the parts that decide and act, shared by the service and `simulate`.

`build_parts` is synchronous and opens nothing but the journal: it makes the clients the settings
name that connect lazily (Prometheus, Alertmanager) and gives the executor everything it reaches
(silences, the range query, the approval base URL, the notifier) when it builds it; `Parts.connect`
opens the rest (Kubernetes, HTTP) and lends them to actions through `ActionDeps`; `Parts.close`
stops the executor's recovery watches and the notifier, then closes every client, the journal last.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import aiohttp

from actions.base import Action, ActionDeps
from daemon.cluster.kube import create_api_client, endpoints_resolver, event_recorder, replicas_resolver
from daemon.common.config import Settings
from daemon.common.metrics import Metrics
from daemon.sources.alertmanager import AlertmanagerClient
from daemon.sources.prometheus import PrometheusClient
from daemon.storage.journal import Journal
from daemon.workers.door import Door
from daemon.workers.evidence import LatestVerdicts
from daemon.workers.context import ActContext
from daemon.workers.executor import Executor, ExecutorLimits
from daemon.workers.state import ExecutorState
from daemon.workers.notifier import Notifier
from daemon.workers.silences import SilenceChecker
from policies.loader import PolicySet


@dataclass
class Parts:
    """The journal, the executor with its state, the outcome notifier, and the clients lent to actions."""

    settings: Settings
    journal: Journal
    state: ExecutorState
    deps: ActionDeps
    executor: Executor
    notifier: Notifier
    ctx: ActContext  # what the executor shares with the pin reconciler the service builds
    prometheus: PrometheusClient | None = None
    kube: Any = None  # kubernetes_asyncio ApiClient when kubernetes.mode is not off
    alertmanager: AlertmanagerClient | None = None  # silences, when alertmanager.url is set
    metrics: Metrics | None = None

    async def connect(self, *, events_as: str | None, clock: Callable[[], float] = time.time,
                      http: bool = True) -> None:
        """Open the Kubernetes and HTTP clients the settings name and lend them to actions.

        Args:
            events_as: reportingInstance of the Kubernetes Events actions record; None records none
                (a read-only run such as `simulate`).
            clock: Unix time for Event timestamps.
            http: Open the shared HTTP session (notify, HTTP timeout sink); a read-only run needs none.

        Raises:
            KubeConfigError: kubernetes.mode names a cluster but no configuration could be loaded.
        """
        if http:
            self.deps.http = aiohttp.ClientSession()
        self.kube = await create_api_client(self.settings.kubernetes)
        if self.kube is not None:
            self.deps.kube = self.kube
            if events_as is not None:
                self.deps.record_event = event_recorder(self.kube, events_as, clock)
        self.deps.endpoints = endpoints_resolver(self.kube)
        self.deps.replicas = replicas_resolver(self.kube)

    async def close(self) -> None:
        """Stop the recovery watches (unsettled ones stay pending in the journal for the next start)
        and the notifier (queued events get a short grace), close every client, then the journal."""
        await self.executor.close()
        await self.notifier.close()
        if self.kube is not None:
            await self.kube.close()
            self.kube = None
        if self.deps.http is not None:
            await self.deps.http.close()
            self.deps.http = None
        if self.prometheus is not None:
            self.prometheus.close()
            self.prometheus = None
        if self.alertmanager is not None:
            await self.alertmanager.close()
            self.alertmanager = None
        self.journal.close()


def base_url(settings: Settings, port: int | None = None) -> str:
    """How operators reach the API: api.externalUrl, else the listen address (a wildcard host as loopback)."""
    if settings.api.external_url:
        return settings.api.external_url.rstrip("/")
    host = settings.listen.host
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if settings.listen.tls else 'http'}://{host}:{port or settings.listen.port}"


def build_parts(settings: Settings, actions: Mapping[str, type[Action]], journal: Journal, metrics: Metrics, *,
                policies: PolicySet | None = None, may_act: Callable[[], bool] = lambda: True,
                clock: Callable[[], float] = time.time,
                on_recorded: Callable[[], None] = lambda: None,
                approval_base_url: Callable[[], str] | None = None,
                latest: LatestVerdicts | None = None) -> Parts:
    """The parts for `settings`, acting on `journal`; nothing is opened but the journal given (the
    Prometheus and Alertmanager clients connect on first use).

    Args:
        policies: The active set; empty until the caller loads one.
        may_act: False while this replica may not act (not the leader).
        on_recorded: Called after an executed plan or a pin is journaled (shared cluster state).
        approval_base_url: How operators reach the API, read whenever an approval notification is
            made (a service knows its port only once it listens); default `base_url(settings)`.
    """
    deps = ActionDeps(triton_timeout_seconds=settings.executor.triton_timeout_seconds)
    state = ExecutorState(policies if policies is not None else PolicySet(), frozen=settings.freeze)
    deps.known_bad = journal.bad_versions.known.in_thread
    # Every write of every action passes the door: freezes, leadership, bad marks, journaled.
    deps.actuator = Door(journal, state, deps, may_act, metrics, clock)
    notifier = Notifier(settings.notifications, metrics, settings.executor.notification_queue_size)
    prometheus = None
    if settings.prometheus.url:
        prometheus = PrometheusClient(settings.prometheus.url, settings.prometheus.timeout_seconds)
        deps.query = prometheus.query
    alertmanager, silences = None, None
    if settings.alertmanager.url:
        alertmanager = AlertmanagerClient(settings.alertmanager.url, settings.alertmanager.timeout_seconds)
        silences = SilenceChecker(alertmanager.silences, clock,
                                  on_result=lambda result: metrics.silence_checks.labels(result).inc())
    # The executor and the pin reconciler share one context: the same locks, leadership and callbacks.
    ctx = ActContext(journal, state, deps, metrics, actions, may_act=may_act, clock=clock, on_recorded=on_recorded,
                     notify=notifier.publish)
    executor = Executor(ctx, silences=silences,
                        query_range=prometheus.query_range if prometheus is not None else None, latest=latest,
                        approval_base_url=approval_base_url or (lambda: base_url(settings)),
                        limits=ExecutorLimits(settings.executor.escalation_freeze_seconds, settings.blast_radius,
                                              settings.executor.max_signal_age_seconds))
    return Parts(settings, journal, state, deps, executor, notifier, ctx, prometheus=prometheus,
                 alertmanager=alertmanager, metrics=metrics)
