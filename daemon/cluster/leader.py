"""Lease-based leader election (coordination.k8s.io/v1): one replica acts, the others wait.

Like client-go's leaderelection: a candidate takes the Lease when its holder has not renewed it
for leaseDurationSeconds *as observed locally* (so clocks need not agree), writes are optimistic
(resourceVersion), and a leader that cannot renew within renewDeadlineSeconds steps down. Since
renewDeadline < leaseDuration and the deadline counts from when the last successful renew was
*sent*, the old leader stops acting before any other replica can see the Lease as expired.

Writes to a system that cannot fence writers (Triton's model control: no term, no
compare-and-swap) need more, since "stops acting" is only as good as the old leader's next look at
its clock. A leader paused (SIGSTOP, a stalled node, a GC) after it decided to write does not look
until it runs again. So: `may_write()` reads the renew deadline on the monotonic clock right before
each such write, whatever the election loop last saw (a paused leader resumed past its deadline
sends nothing), and a new leader waits `write_fence_seconds` after it took over, the Lease duration
plus the write's request timeout, before its first such write, then re-observes: a write the old
leader sent before its deadline has landed or timed out by then. The window that remains: a write
whose check passed just before the old leader's deadline and whose bytes then sat (the process
paused between the check and the send, or the network held them) for longer than that wait; and a
request Triton keeps executing after its client gave up. docs/design-notes.md says more.

A replica that could renew but cannot do the work (its journal writes fail, or one of its loops
keeps crashing: `may_lead` says why) must not keep the Lease either: it steps down, hands the Lease back, and does not campaign until
`may_lead` clears, so a replica that can work takes over at its next round.
"""
from __future__ import annotations

import asyncio
import datetime
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient, CoordinationV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from daemon.common.config import LeaderElectionSettings
from daemon.common.lifecycle import wait_or_stop

log = structlog.get_logger("tailguard.leader")


class LeaderElectionError(Exception):
    """Settings that cannot give the step-down guarantee."""


@dataclass
class _Observed:
    """The Lease record last seen and when (local monotonic time) it last changed."""

    resource_version: str | None = None
    holder: str | None = None
    at: float = 0.0


def _micro_time(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for one Lease and reports changes through `on_change(is_leader)`.

    Args:
        api: The Kubernetes client.
        settings: Lease name/namespace and the three durations.
        identity: This replica's holderIdentity (POD_NAME, or hostname_pid).
        on_change: Called with True when this replica starts leading, False when it stops.
        wall: Unix time for the Lease's timestamps.
        monotonic: Local time for expiry and deadlines (immune to wall-clock jumps).
        sleep: Waits between attempts (tests may speed it up).
        release_on_stop: On a clean stop, hand the Lease back so a successor need not wait.
        may_lead: Why this replica must not hold the Lease now (its journal cannot be written, a loop
            keeps crashing), or None; asked every round.
    """

    def __init__(self, api: ApiClient, settings: LeaderElectionSettings, identity: str,
                 on_change: Callable[[bool], None], *, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 release_on_stop: bool = True,
                 may_lead: Callable[[], str | None] = lambda: None) -> None:
        if settings.renew_deadline_seconds >= settings.lease_duration_seconds:
            raise LeaderElectionError(
                f"renewDeadlineSeconds ({settings.renew_deadline_seconds}) must be below "
                f"leaseDurationSeconds ({settings.lease_duration_seconds}): a leader must stop "
                "acting before its Lease can be taken")
        if settings.retry_period_seconds >= settings.renew_deadline_seconds:
            raise LeaderElectionError("retryPeriodSeconds must be below renewDeadlineSeconds")
        self._api = CoordinationV1Api(api)
        self.settings = settings
        self.identity = identity
        self._on_change = on_change
        self._wall, self._monotonic, self._sleep = wall, monotonic, sleep
        self._release_on_stop = release_on_stop
        self._may_lead = may_lead
        self.standing_aside: str | None = None  # why this replica does not campaign now (may_lead)
        self._observed = _Observed()
        self._last_renew = -math.inf
        self.is_leader = False
        # When this replica last took the Lease over (monotonic), and whether from a holder that may
        # still be writing (the Lease was held, not handed back or created): the write fence.
        self._acquired_at: float | None = None
        self._from_holder = False
        self._seen_holder: str | None = None
        self._created = False  # the last attempt created the Lease: nobody held it before
        self._seen_duration = float(math.ceil(settings.lease_duration_seconds))
        self.transitions: int | None = None  # the Lease's leaseTransitions as this replica last wrote it

    # ---- state --------------------------------------------------------------------------------

    def _set(self, leader: bool, why: str) -> None:
        if leader == self.is_leader:
            return
        self.is_leader = leader
        log.info("leader election", leader=leader, identity=self.identity, reason=why,
                 lease=f"{self.settings.lease_namespace}/{self.settings.lease_name}")
        self._on_change(leader)

    def _deadline_left(self) -> float:
        return self._last_renew + self.settings.renew_deadline_seconds - self._monotonic()

    # ---- loop ---------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign and renew until `stop` is set (or the task is cancelled); bounded waits only."""
        try:
            while not stop.is_set():
                await self._round()
                wait = self.settings.retry_period_seconds
                if self.is_leader:
                    wait = min(wait, max(0.0, self._deadline_left()))
                await wait_or_stop(stop, wait)
        finally:
            if self.is_leader:
                self._set(False, "stopping")
                if self._release_on_stop:
                    await asyncio.shield(self._release())

    async def _round(self) -> None:
        if await self._stand_aside():
            return
        if self.is_leader and self._deadline_left() <= 0:
            self._set(False, "renew deadline passed")
        budget = self._deadline_left() if self.is_leader else self.settings.renew_deadline_seconds
        sent = self._monotonic()
        try:
            ok = await asyncio.wait_for(self._try_acquire_or_renew(), timeout=max(budget, 0.001))
        except asyncio.TimeoutError:
            ok = False
            log.warning("lease request timed out", identity=self.identity)
        if ok:
            self._last_renew = sent  # counted from when it was sent: the conservative side
            if not self.is_leader:  # a takeover: its fence counts from when the winning write was sent
                self._acquired_at = None if self._created else sent
                self._from_holder = self._seen_holder is not None
            self._set(True, "acquired lease")
        elif self.is_leader and self._deadline_left() <= 0:
            self._set(False, "could not renew within renewDeadlineSeconds")

    async def _stand_aside(self) -> bool:
        """While `may_lead` names a reason: step down (handing the Lease back) and do not campaign.
        Whether this round stands aside."""
        reason = self._may_lead()
        if reason is None:
            if self.standing_aside is not None:
                log.info("may lead again; campaigning", identity=self.identity)
                self.standing_aside = None
            return False
        if self.standing_aside is None:
            log.warning("cannot do the leader's work; not holding the Lease", identity=self.identity, reason=reason)
        self.standing_aside = reason
        if self.is_leader:
            self._set(False, reason)
            self._last_renew = -math.inf
            await self._release()  # the next replica need not wait leaseDurationSeconds
        return True

    async def _try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease now. Never raises for API errors."""
        s = self.settings
        try:
            lease = await self._api.read_namespaced_lease(s.lease_name, s.lease_namespace)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("cannot read lease", status=exc.status, reason=exc.reason)
                return False
            return await self._create()
        except (aiohttp.ClientError, OSError) as exc:  # the API is unreachable: try again next round
            log.warning("cannot reach the API for the lease", error=f"{type(exc).__name__}: {exc}")
            return False
        spec = lease.spec
        holder = spec.holder_identity or None
        # Held by anyone but this process (a previous incarnation under the same name counts): a
        # takeover of it waits out that holder's writes.
        self._seen_holder = holder if not self.is_leader else None
        self._created = False
        rv = lease.metadata.resource_version
        now = self._monotonic()
        if rv != self._observed.resource_version:
            self._observed = _Observed(rv, holder, now)
        duration = spec.lease_duration_seconds or s.lease_duration_seconds
        self._seen_duration = float(duration)  # what the holder wrote: the fence waits that long
        if holder not in (None, self.identity) and now < self._observed.at + duration:
            return False  # held by another replica that renewed within its lease duration
        taking_over = holder != self.identity
        # As client-go: every change of holder counts, a takeover of a released Lease included.
        transitions = (spec.lease_transitions or 0) + (1 if taking_over else 0)
        stamp = _micro_time(self._wall())
        acquire = stamp if taking_over or spec.acquire_time is None else _micro_time(spec.acquire_time.timestamp())
        metadata = {"resourceVersion": rv, "labels": dict(lease.metadata.labels or {})}
        landed = await self._write(
            self._api.replace_namespaced_lease(s.lease_name, s.lease_namespace,
                                               self._body(metadata, acquire, stamp, transitions)),
            "update", taking_over=taking_over)  # 409: someone else wrote first; decide again next round
        if landed:
            self.transitions = transitions
        return landed

    # ---- writes that cannot be fenced ------------------------------------------------------------

    def may_write(self) -> bool:
        """Whether this replica may send a write that nothing downstream fences, now: it leads and
        its renew deadline has not passed on the monotonic clock (checked afresh, not the election
        loop's last look: right after a pause the loop may not have run yet)."""
        return self.is_leader and self._deadline_left() > 0

    def write_fence_seconds(self, request_timeout_seconds: float) -> float:
        """How long this replica must still wait, after taking the Lease over, before its first write
        that nothing downstream fences: the Lease duration the old holder wrote (when it had not handed
        the Lease back) plus that write's request timeout, counted from the takeover; 0 when it
        created the Lease or the wait is over."""
        if self._acquired_at is None:
            return 0.0
        lease = self._seen_duration if self._from_holder else 0.0
        return max(0.0, self._acquired_at + lease + request_timeout_seconds - self._monotonic())

    async def _create(self) -> bool:
        stamp = _micro_time(self._wall())
        metadata = {"labels": {"app.kubernetes.io/managed-by": "tailguard"}}
        self._seen_holder, self._created = None, True  # the first holder ever: no earlier writer to wait for
        landed = await self._write(  # 409 AlreadyExists: another replica created it first
            self._api.create_namespaced_lease(self.settings.lease_namespace,
                                              self._body(metadata, stamp, stamp, 0)),
            "create")
        if landed:
            self.transitions = 0
        return landed

    def _body(self, metadata: dict[str, Any], acquire: str, renew: str, transitions: int) -> dict[str, Any]:
        s = self.settings
        return {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": s.lease_name, "namespace": s.lease_namespace, **metadata},
            "spec": {"holderIdentity": self.identity,
                     "leaseDurationSeconds": int(math.ceil(s.lease_duration_seconds)),
                     "acquireTime": acquire, "renewTime": renew, "leaseTransitions": transitions},
        }

    async def _write(self, call: Awaitable[Any], verb: str, **log_fields: Any) -> bool:
        """Await a Lease create/replace; True (and the new resourceVersion observed) if it landed."""
        try:
            written = await call
        except ApiException as exc:
            log.info(f"lease {verb} refused", status=exc.status, reason=exc.reason, **log_fields)
            return False
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("cannot reach the API for the lease", error=f"{type(exc).__name__}: {exc}")
            return False
        self._observed = _Observed(written.metadata.resource_version, self.identity, self._monotonic())
        return True

    async def _release(self) -> None:
        """Hand the Lease back (holder cleared) if we still hold it; best effort, bounded."""
        s = self.settings
        try:
            lease = await asyncio.wait_for(self._api.read_namespaced_lease(s.lease_name, s.lease_namespace),
                                           timeout=s.retry_period_seconds)
            if lease.spec.holder_identity != self.identity:
                return
            body = {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": s.lease_name, "namespace": s.lease_namespace,
                             "resourceVersion": lease.metadata.resource_version,
                             "labels": dict(lease.metadata.labels or {})},
                "spec": {"leaseDurationSeconds": 1, "renewTime": _micro_time(self._wall()),
                         "leaseTransitions": lease.spec.lease_transitions or 0},
            }
            await asyncio.wait_for(self._api.replace_namespaced_lease(s.lease_name, s.lease_namespace, body),
                                   timeout=s.retry_period_seconds)
            log.info("lease released", identity=self.identity)
        except (ApiException, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            # The lease then simply expires; the successor waits leaseDurationSeconds.
            log.warning("could not release lease", error=f"{type(exc).__name__}: {exc}")
