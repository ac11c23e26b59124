"""The daemon's operations as the HTTP app asks for them (`Daemon` in daemon/http/app.py): the
service's journal, freezes, intake and executor stay behind named calls, and the app gets its limits
from the settings once, at build time."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

import structlog
from aiohttp import web
from prometheus_client import generate_latest

from core.signal import Signal
from daemon.cluster.shards import ShardManager
from daemon.common.config import Settings
from daemon.common.metrics import Metrics
from daemon.http.api import Leadership
from daemon.http.app import build_app
from daemon.http.auth import Credentials, TokenSet
from daemon.http.setup import BodyLimits, HttpSetup
from daemon.http.status import StatusInputs
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE, FOREVER, BadVersionMark, EndedPin, Freeze
from daemon.workers.approvals import ApprovalResult
from daemon.workers.freezes import FreezeControl, FreezeError
from daemon.workers.signal_intake import Recorded, SignalIntake
from daemon.wiring.sharding import sharding_status

log = structlog.get_logger("tailguard.http")


class Approver(Protocol):
    async def approve(self, approval_id: int, by: str, reason: str) -> ApprovalResult: ...


class ServiceParts(Protocol):
    """What the operations read from the service (daemon/wiring/service.py), named here so that
    this module does not import it (the service imports this one)."""

    settings: Settings
    metrics: Metrics
    clock: Callable[[], float]
    identity: str
    webhook_token: str | None
    api_tokens: TokenSet
    journal: Journal
    intake: SignalIntake
    freezes: FreezeControl
    shards: ShardManager | None  # sharding.shards > 1

    @property
    def executor(self) -> Approver: ...

    def may_act(self) -> bool: ...

    async def leader_identity(self) -> str | None: ...

    async def status_inputs(self) -> StatusInputs: ...

    def known_targets(self) -> set[str]: ...

    def state_recorded(self) -> None: ...

    def loop_trouble(self) -> str | None: ...

    def readiness(self) -> dict[str, Any]: ...


class DaemonOperations:
    """Implements the HTTP app's `Daemon` protocol over the running service."""

    def __init__(self, service: ServiceParts) -> None:
        self._service = service

    # ---- probes and the webhook ---------------------------------------------------------------

    def credentials(self) -> Credentials:
        return Credentials(self._service.webhook_token, self._service.api_tokens)  # rotated: read per request

    def may_answer(self, leader_only: bool) -> bool:
        return self._service.may_act() or (not leader_only and self._service.journal.shared)

    async def leadership(self) -> Leadership:
        leader = await self._service.leader_identity()
        return Leadership(replica=self._service.identity, leader=leader)

    async def ingest_alerts(self, signals: Sequence[Signal]) -> Recorded:
        # Alertmanager sends refused alerts again (it is told to retry), so they count as resent.
        return await self._service.intake.record(signals, resent=True)

    def liveness(self) -> str | None:
        return self._service.loop_trouble()

    async def readiness(self) -> dict[str, Any]:
        await self._refresh_freezes()
        return self._service.readiness()

    async def scrape(self) -> bytes:
        await self._refresh_freezes()
        return generate_latest(self._service.metrics.registry)

    async def _refresh_freezes(self) -> None:
        """Read the freezes in force (expiry is a matter of time); a journal failure keeps the last view."""
        try:
            await self._service.freezes.view()
        except JournalError as exc:
            self._service.metrics.faults.labels("journal").inc()
            log.warning("could not read freezes; showing the last view", error=str(exc))

    # ---- the operator API ---------------------------------------------------------------------

    async def status(self) -> StatusInputs:
        inputs = await self._service.status_inputs()
        shards = self._service.shards
        if shards is None:
            return inputs
        # Every shard with the replica leading it, from the Leases and the shared journal's terms.
        return dataclasses.replace(inputs, sharding=await sharding_status(shards, self._service.journal,
                                                                          inputs.policies))

    def _named(self, scope: str) -> None:
        """Raises FreezeError (422) for a target no policy names (the whole daemon always is)."""
        known = self._service.known_targets()
        if scope != DAEMON_SCOPE and scope not in known:
            raise FreezeError(422, f"target: no policy names {scope} (known: {', '.join(sorted(known)) or 'none'})")

    async def freeze(self, scope: str, reason: str, by: str, duration_seconds: float | None) -> Freeze:
        self._named(scope)
        freezes = self._service.freezes
        until = FOREVER if duration_seconds is None else freezes.now() + duration_seconds
        return await freezes.freeze(scope, reason, by, "api", until)

    async def unfreeze(self, scope: str, reason: str, by: str) -> list[Freeze]:
        return await self._service.freezes.unfreeze(scope, reason, by, "api")

    async def approve(self, approval_id: int, by: str, reason: str) -> ApprovalResult:
        return await self._service.executor.approve(approval_id, by, reason)

    async def bad_versions(self, target: str, include_cleared: bool) -> Sequence[BadVersionMark]:
        return await self._service.journal.bad_versions.of.in_thread(target, include_cleared=include_cleared)

    async def mark_bad_version(self, target: str, version: int, reason: str) -> bool:
        self._named(target)
        return self._recorded(await self._service.journal.bad_versions.mark.in_thread(target, version, reason))

    async def clear_bad_version(self, target: str, version: int, reason: str) -> bool:
        return self._recorded(bool(await self._service.journal.bad_versions.clear.in_thread(target, version, reason)))

    async def unpin(self, target: str, reason: str) -> EndedPin | None:
        ended = await self._service.journal.pins.end.in_thread(target, reason)
        self._recorded(ended is not None)
        return ended

    def _recorded(self, changed: bool) -> bool:
        """A shared record changed: the cluster state publishes it."""
        if changed:
            self._service.state_recorded()
        return changed


def http_setup(settings: Settings, metrics: Metrics, clock: Callable[[], float]) -> HttpSetup:
    w, a = settings.webhook, settings.api
    return HttpSetup(metrics=metrics, clock=clock,
                     webhook=BodyLimits(w.max_body_bytes, w.body_read_timeout_seconds),
                     api=BodyLimits(a.max_body_bytes, a.body_read_timeout_seconds),
                     max_concurrent_webhooks=w.max_concurrent_requests, access_log=settings.log.access)


def http_app(service: ServiceParts) -> web.Application:
    """The HTTP app over the service's operations."""
    return build_app(DaemonOperations(service), http_setup(service.settings, service.metrics, service.clock))
