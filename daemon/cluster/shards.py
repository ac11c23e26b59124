"""The shard manager: one Kubernetes Lease per shard (`<prefix>-shard-<i>`), each replica holding
about its share, so that every replica leads the targets of its shards (sharding.shards > 1).

Each round (every retryPeriodSeconds) it lists the namespace's Leases once and:
- renews its membership Lease (`<prefix>-member-<replica>`): the live members are the holders of
  membership Leases renewed within their duration, as observed locally (clocks need not agree);
- computes its rendezvous share among the live members (daemon/cluster/shard_assignment.py) and
  its fair share, ceil(shards / members);
- hands back (holder cleared, so the next holder need not wait) the shards rendezvous gives another
  live member, and any it holds past its fair share;
- renews the shards it holds, and takes the shards of its share that are free: never created,
  handed back, or not renewed for their leaseDurationSeconds (an orphan of a dead replica, whose
  membership expires at the same time, so its shards fall to the survivors' shares). A shard outside
  its share that stays orphaned for two lease durations (its preferred member alive but not taking
  it) is taken too while this replica holds less than its fair share.

A shard counts as led (`may_write`) only once the journal handed this replica the shard's term
(`take_term`, daemon/storage/shard_terms.py), and only until its renew deadline passes: as the
single-leader elector (daemon/cluster/leader.py), a holder that cannot renew within
renewDeadlineSeconds stops writing before anyone can see its Lease as expired.
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

from daemon.cluster.shard_assignment import fair_share, preferred, shard_of, to_hand_back
from daemon.cluster.shard_view import LeaseSeen, ShardingInputs
from daemon.common.config import LeaderElectionSettings, ShardingSettings
from daemon.common.lifecycle import wait_or_stop

log = structlog.get_logger("tailguard.shards")

SHARDS_LABEL = "tailguard.io/shards"
"""On every shard Lease: the shard count of the replica that wrote it (replicas must agree)."""


@dataclass
class _Seen:
    """A Lease as last seen: its resourceVersion, holder and when (local monotonic) it last changed."""

    resource_version: str | None
    holder: str | None
    at: float
    duration: float
    shards: str | None = None


def _micro_time(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ShardManager:
    """Holds this replica's share of the shard Leases; reports the shards it leads via `on_change`.

    Args:
        api: The Kubernetes client.
        election: The Leases' namespace and durations (leaderElection.*).
        sharding: The shard count and Lease prefix.
        identity: This replica's holderIdentity.
        take_term: Takes the shard's term in the journal right after its Lease was taken; False (the
            journal failed, or refused the shard count) hands the Lease back.
        on_change: Called with the shards this replica leads whenever that set changes.
        stale_terms: Of the shards led, those whose journal term is no longer this replica's (a single
            leader of the previous release took a term since, or the term was replaced while this
            replica kept the Lease): their terms are taken anew, each round. None: not asked.
        wall, monotonic: Unix time for the Leases' stamps; local time for expiry and deadlines.
    """

    def __init__(self, api: ApiClient, election: LeaderElectionSettings, sharding: ShardingSettings, identity: str,
                 take_term: Callable[[int], Awaitable[bool]], on_change: Callable[[frozenset[int]], None] = lambda _: None,
                 *, stale_terms: Callable[[frozenset[int]], Awaitable[frozenset[int]]] | None = None,
                 wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._api = CoordinationV1Api(api)
        self.election = election
        self.shards = sharding.shards
        self.prefix = sharding.lease_prefix or election.lease_name
        self.identity = identity
        self._take_term, self._on_change, self._stale_terms = take_term, on_change, stale_terms
        self._wall, self._monotonic = wall, monotonic
        self._seen: dict[str, _Seen] = {}
        self._renewed: dict[int, float] = {}  # shard -> when its last successful write was sent (monotonic)
        self._termed: set[int] = set()  # shards whose term this replica took since it took their Lease
        # shard -> (when this replica took its Lease, the Lease duration its previous holder wrote, 0
        # when handed back; whether anyone held it before): the takeover's write fence.
        self._fences: dict[int, tuple[float, float, bool]] = {}
        self._led: frozenset[int] = frozenset()
        self.members: frozenset[str] = frozenset({identity})
        self.release_on_stop = True  # on a clean stop, hand every shard back (tests of a crash turn it off)
        self.share = self.shards
        self._listed_at: float | None = None  # when (monotonic) the Leases were last listed

    # ---- what the door, the executor and the poller ask -------------------------------------------

    def shard_name(self, shard: int) -> str:
        return f"{self.prefix}-shard-{shard}"

    @property
    def member_name(self) -> str:
        return f"{self.prefix}-member-{self.identity}"

    def shard_of(self, target: str) -> int:
        return shard_of(target, self.shards)

    @property
    def led(self) -> frozenset[int]:
        """The shards this replica leads (Lease held within its renew deadline, term taken)."""
        return frozenset(s for s in self._led if self._deadline_left(s) > 0)

    def may_write(self, shard: int) -> bool:
        """Whether this replica leads `shard` now: checked afresh on the monotonic clock."""
        return shard in self._led and self._deadline_left(shard) > 0

    def write_fence_seconds(self, shard: int, request_timeout_seconds: float) -> float:
        """How long this replica must still wait, after taking `shard` over, before its first write that
        nothing downstream fences (Triton): the Lease duration its previous holder wrote plus the write's
        request timeout, counted from the takeover (as LeaderElector.write_fence_seconds); the request
        timeout alone when it was handed back (a write the old holder had in flight); 0 when nobody
        held it before, or the wait is over."""
        fence = self._fences.get(shard)
        if fence is None or not fence[2]:
            return 0.0
        taken_at, duration, _ = fence
        return max(0.0, taken_at + duration + request_timeout_seconds - self._monotonic())

    def owns(self, target: str) -> bool:
        """Whether this replica leads the shard of `target` now."""
        return self.may_write(self.shard_of(target))

    def view(self) -> ShardingInputs:
        """The shard Leases as this replica last saw them (for status; no API call): each one's holder
        and when it was last written, on the wall clock, as observed here (expiry is judged as the
        manager judges it, clocks need not agree). The journal's terms are added by the caller."""
        offset = self._wall() - self._monotonic()
        leases = {s: LeaseSeen(seen.holder, seen.at + offset, seen.duration)
                  for s in range(self.shards) if (seen := self._seen.get(self.shard_name(s))) is not None}
        return ShardingInputs(self.shards, tuple(sorted(self.members)), tuple(sorted(self.led)), leases,
                              None if self._listed_at is None else self._listed_at + offset)

    def _deadline_left(self, shard: int) -> float:
        return self._renewed.get(shard, -math.inf) + self.election.renew_deadline_seconds - self._monotonic()

    def _set_led(self, led: frozenset[int], why: str) -> None:
        if led != self._led:
            log.info("shards led", identity=self.identity, shards=sorted(led), reason=why)
            self._led = led
            self._on_change(led)

    # ---- loop -------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Hold this replica's share until `stop` is set; on the way out, hand every shard back."""
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(self.round(), timeout=self.election.renew_deadline_seconds)
                except asyncio.TimeoutError:
                    log.warning("shard round timed out", identity=self.identity)
                self._expire_deadlines()
                await wait_or_stop(stop, self.election.retry_period_seconds)
        finally:
            self._set_led(frozenset(), "stopping")
            if self.release_on_stop:
                await asyncio.shield(self._release_all())

    def _expire_deadlines(self) -> None:
        self._set_led(frozenset(s for s in self._led if self._deadline_left(s) > 0), "renew deadline passed")

    async def round(self) -> None:
        """One look at the Leases and the writes it calls for. Never raises for API errors."""
        self._expire_deadlines()
        try:
            listed = await self._api.list_namespaced_lease(self.election.lease_namespace)
        except (ApiException, aiohttp.ClientError, OSError) as exc:
            log.warning("cannot list the shard leases", error=f"{type(exc).__name__}: {exc}")
            return
        now = self._listed_at = self._monotonic()
        leases = {item.metadata.name: item for item in listed.items
                  if item.metadata.name.startswith(f"{self.prefix}-")}
        for name, lease in leases.items():
            self._observe(name, lease, now)
        await self._renew_membership(leases.get(self.member_name))
        # A replica running another shard count is no member: the journal refuses its shard terms, so
        # counting it would hand it shards it can never lead.
        members = {seen.holder for name, seen in self._seen.items()
                   if name.startswith(f"{self.prefix}-member-") and name in leases and seen.holder
                   and now < seen.at + seen.duration and seen.shards == str(self.shards)}
        self.members = frozenset(members | {self.identity})
        wanted = preferred(self.shards, self.members, self.identity)
        self.share = fair_share(self.shards, len(self.members))
        held = [s for s in range(self.shards) if self._holder(leases, s) == self.identity]
        for s in [s for s in self._renewed if s not in held]:  # taken over (or edited by hand): led no more
            log.warning("shard lease no longer held", shard=s, holder=self._holder(leases, s))
            self._renewed.pop(s, None)
            self._termed.discard(s)
        self._set_led(frozenset(s for s in self._led if s in held), "lease lost")
        # Not while its takeover fence runs: the next holder would wait only for this replica's writes,
        # not for those of the holder this one took the shard from.
        fenced = {s for s in held if self.write_fence_seconds(s, 0.0) > 0}
        give = [s for s in held if s not in wanted and s not in fenced]
        give += to_hand_back([s for s in held if s in wanted and s not in fenced], wanted, self.share)
        for s in give:
            await self._hand_back(s, leases[self.shard_name(s)])
        keep = [s for s in held if s not in give]
        for s in keep:
            await self._write(s, leases[self.shard_name(s)])
        count = len(keep)
        for s in range(self.shards):
            if s in held or count >= self.share:
                continue
            lease = leases.get(self.shard_name(s))
            if lease is None:
                if s in wanted and await self._write(s, None):
                    count += 1
                continue
            seen = self._seen[self.shard_name(s)]
            if seen.shards not in (None, str(self.shards)):
                log.error("shard lease written with another shard count; not taken", lease=self.shard_name(s),
                          its_shards=seen.shards, shards=self.shards)
                continue
            free = seen.holder is None or now >= seen.at + seen.duration
            orphaned_long = seen.holder is not None and now >= seen.at + 2 * seen.duration
            if free and (s in wanted or orphaned_long) and await self._write(s, lease):
                count += 1
        await self._take_terms()

    def _holder(self, leases: dict[str, Any], shard: int) -> str | None:
        lease = leases.get(self.shard_name(shard))
        return (lease.spec.holder_identity or None) if lease is not None else None

    def _observe(self, name: str, lease: Any, now: float) -> None:
        rv = lease.metadata.resource_version
        seen = self._seen.get(name)
        duration = float(lease.spec.lease_duration_seconds or self.election.lease_duration_seconds)
        shards = (lease.metadata.labels or {}).get(SHARDS_LABEL)
        if seen is None or seen.resource_version != rv:
            self._seen[name] = _Seen(rv, lease.spec.holder_identity or None, now, duration, shards)

    async def _take_terms(self) -> None:
        """A shard whose Lease this replica holds but whose term it has not taken: take it now
        (right after the takeover, or retried after the journal failed)."""
        if self._stale_terms is not None and self._termed:
            stale = await self._stale_terms(frozenset(self._termed))
            if stale:
                log.warning("shard terms no longer current; taking them anew", shards=sorted(stale))
                self._termed -= stale
        for s in sorted(self._renewed):
            if s in self._termed or self._deadline_left(s) <= 0:
                continue
            if await self._take_term(s):
                self._termed.add(s)
            else:  # no term, no writes: the Lease goes back for a replica whose journal works
                self._renewed.pop(s, None)
                await self._hand_back(s, None)
        self._set_led(frozenset(s for s in self._termed if self._deadline_left(s) > 0), "shard terms taken")

    # ---- writes -----------------------------------------------------------------------------------

    def _body(self, name: str, rv: str | None, holder: str | None, acquire: str | None, transitions: int,
              duration: float) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name, "namespace": self.election.lease_namespace,
                                    "labels": {"app.kubernetes.io/managed-by": "tailguard",
                                               SHARDS_LABEL: str(self.shards)}}
        if rv is not None:
            metadata["resourceVersion"] = rv
        spec: dict[str, Any] = {"leaseDurationSeconds": int(math.ceil(duration)),
                                "renewTime": _micro_time(self._wall()), "leaseTransitions": transitions}
        if holder is not None:
            spec["holderIdentity"] = holder
            spec["acquireTime"] = acquire or _micro_time(self._wall())
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    async def _put(self, name: str, lease: Any | None, holder: str | None, duration: float) -> bool:
        """Create or replace (optimistically, by resourceVersion) one Lease; True if it landed."""
        ns = self.election.lease_namespace
        try:
            if lease is None:
                written = await self._api.create_namespaced_lease(ns, self._body(name, None, holder, None, 0, duration))
            else:
                spec = lease.spec
                taking_over = holder is not None and spec.holder_identity != holder
                transitions = (spec.lease_transitions or 0) + (1 if taking_over else 0)
                acquire = None if taking_over or spec.acquire_time is None else _micro_time(spec.acquire_time.timestamp())
                written = await self._api.replace_namespaced_lease(
                    name, ns, self._body(name, lease.metadata.resource_version, holder, acquire, transitions, duration))
        except ApiException as exc:  # 409: another replica wrote first; decided again next round
            log.info("shard lease write refused", lease=name, status=exc.status, reason=exc.reason)
            return False
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("cannot reach the API for a shard lease", lease=name, error=f"{type(exc).__name__}: {exc}")
            return False
        self._seen[name] = _Seen(written.metadata.resource_version, holder, self._monotonic(),
                                 float(math.ceil(duration)), str(self.shards))
        return True

    async def _write(self, shard: int, lease: Any | None) -> bool:
        """Take or renew `shard`'s Lease for this replica."""
        sent = self._monotonic()
        taking = lease is None or lease.spec.holder_identity != self.identity
        if not await self._put(self.shard_name(shard), lease, self.identity, self.election.lease_duration_seconds):
            return False
        if taking or shard not in self._renewed:
            self._termed.discard(shard)  # a takeover: the journal's term is taken anew
            # Taken from a holder that may still be writing (its Lease expired; a previous incarnation
            # under this name counts): its Triton writes are waited out, the Lease duration it wrote
            # plus the request timeout. Handed back (holder cleared while running): the request
            # timeout only, for a write it had in flight. Never held: no wait.
            holder = lease.spec.holder_identity if lease is not None else None
            ever_held = lease is not None  # whoever created it held it
            duration = float(lease.spec.lease_duration_seconds or 0) if lease is not None and holder else 0.0
            self._fences[shard] = (sent, duration, ever_held)
            log.info("shard lease taken", shard=shard, identity=self.identity, from_holder=bool(holder))
        self._renewed[shard] = sent
        return True

    async def _renew_membership(self, lease: Any | None) -> None:
        await self._put(self.member_name, lease, self.identity, self.election.lease_duration_seconds)

    async def _hand_back(self, shard: int, lease: Any | None) -> None:
        """Stop leading `shard` at once, then clear its holder so the next replica need not wait."""
        self._renewed.pop(shard, None)
        self._termed.discard(shard)
        self._set_led(self._led - {shard}, "handed back")
        name = self.shard_name(shard)
        if lease is None:
            try:
                lease = await self._api.read_namespaced_lease(name, self.election.lease_namespace)
            except (ApiException, aiohttp.ClientError, OSError):
                return  # it expires instead
        if lease.spec.holder_identity != self.identity:
            return
        if await self._put(name, lease, None, 1):
            log.info("shard lease handed back", shard=shard, identity=self.identity)

    async def _release_all(self) -> None:
        """On a clean stop: hand every shard and the membership back (bounded; best effort)."""
        try:
            await asyncio.wait_for(self._release_all_unbounded(), timeout=self.election.renew_deadline_seconds)
        except (asyncio.TimeoutError, ApiException, aiohttp.ClientError, OSError) as exc:
            log.warning("could not hand the shard leases back; they expire", error=f"{type(exc).__name__}: {exc}")

    async def _release_all_unbounded(self) -> None:
        for s in sorted(self._renewed):
            await self._hand_back(s, None)
        try:
            lease = await self._api.read_namespaced_lease(self.member_name, self.election.lease_namespace)
        except ApiException:
            return
        if lease.spec.holder_identity == self.identity:
            await self._put(self.member_name, lease, None, 1)
