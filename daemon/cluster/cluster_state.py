"""Cluster state shared between replicas through one ConfigMap: pins and guard marks (times of
executed plans), so a new leader keeps the old leader's cooldowns, rate limits and pins; and pin
ends, bad-version marks and freezes (with their clears and lifts), so it does not bring an ended
pin back, knows the versions rolled back from and does not act on a frozen target.

The leader publishes a snapshot of its journal after every executed plan and recorded pin
(optimistic writes merged with what is there; nothing is ever blindly overwritten). A replica
that becomes leader imports the document into its journal before it may act.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal
from daemon.storage.records import BadClear, BadMark, ExecutedMark, FreezeMark, Lift, Pin, PinEnd, SharedState
from daemon.common.lifecycle import wait_or_stop
from daemon.common.metrics import Metrics
from policies.loader import PolicySet
from policies.schema import Guards

log = structlog.get_logger("tailguard.cluster_state")

DATA_KEY = "state.json"
FORMAT_VERSION = 2  # written only when the document carries a section version 1 lacks
READABLE_VERSIONS = (1, 2)
MAX_MARKS_PER_KEY = 100  # a ConfigMap holds 1 MiB; no policy needs more marks than its maxActions
MAX_BAD_PER_TARGET = 50  # the newest bad-version marks per target (rollbacks are rare)
MAX_FREEZES_PER_TARGET = 20  # freezes in force per target, the longest kept
# Ends, clears and lifts are kept at least this long, whatever the guard horizon: a replica that was
# a follower for a while may still hold the pin, mark or freeze they ended, and would publish it again.
TOMBSTONE_SECONDS = 7 * 24 * 3600.0
MAX_CONFLICT_RETRIES = 5

Key = tuple[str, int]


class ClusterStateError(Exception):
    """The shared document could not be read or written (API error, or content we do not understand)."""


@dataclass(frozen=True)
class StateDocument:
    """pins: {target: {model, version, at}}; marks: {"policy|target": sorted unix times};
    ends: {target: {at (the pin's), endedAt, reason}}: the newest pin end known per target;
    bad: {(target, version): {at, reason}} marks in force; clears: {(target, version): {at, reason}};
    freezes: {(target, at): {until, reason}} in force; lifts: {target: {at, reason, until}}."""

    pins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    marks: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    ends: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    bad: Mapping[Key, Mapping[str, Any]] = field(default_factory=dict)
    clears: Mapping[Key, Mapping[str, Any]] = field(default_factory=dict)
    freezes: Mapping[tuple[str, float], Mapping[str, Any]] = field(default_factory=dict)
    lifts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def render(self) -> str:
        doc: dict[str, Any] = {"version": 1, "pins": self.pins,
                               "guardMarks": {k: list(v) for k, v in self.marks.items()}}
        if self.ends or self.bad or self.clears or self.freezes or self.lifts:
            # Version 2 only then: a replica that reads only version 1 refuses it instead of
            # writing it back without the ends (which would bring ended pins back).
            doc |= {"version": FORMAT_VERSION, "pinEnds": self.ends,
                    "badVersions": _nest(self.bad), "badVersionClears": _nest(self.clears),
                    "freezes": _nest_list(self.freezes), "freezeLifts": self.lifts}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    def shared(self) -> SharedState:
        """The journal's view of the sections beyond pins and marks."""
        return SharedState(
            pin_ends=tuple(PinEnd(target=t, at=float(e["at"]), ended_at=float(e["endedAt"]), reason=str(e["reason"]))
                           for t, e in self.ends.items()),
            bad_marks=tuple(BadMark(target=t, version=v, reason=str(m["reason"]), at=float(m["at"]))
                            for (t, v), m in self.bad.items()),
            bad_clears=tuple(BadClear(target=t, version=v, at=float(c["at"]), reason=str(c["reason"]))
                             for (t, v), c in self.clears.items()),
            freezes=tuple(FreezeMark(target=t, reason=str(f["reason"]), at=at, until=float(f["until"]))
                          for (t, at), f in self.freezes.items()),
            lifts=tuple(Lift(target=t, at=float(lift["at"]), reason=str(lift["reason"]), until=float(lift["until"]))
                        for t, lift in self.lifts.items()))


def _nest(entries: Mapping[Key, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (target, version), entry in entries.items():
        out.setdefault(target, {})[str(version)] = dict(entry)
    return out


def _nest_list(entries: Mapping[tuple[str, float], Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for (target, at), entry in sorted(entries.items()):
        out.setdefault(target, []).append({"at": at, **entry})
    return out


def _timed(raw: Any, *, until: bool = False) -> dict[str, Any]:
    entry = {"at": float(raw["at"]), "reason": str(raw["reason"])}
    return entry | {"until": float(raw["until"])} if until else entry


def parse_document(text: str | None) -> StateDocument:
    """The document stored under `state.json` (version 1 or 2); empty when absent. Raises ClusterStateError."""
    if not text:
        return StateDocument()
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"unknown format version {raw.get('version') if isinstance(raw, dict) else raw!r}")
        pins = {str(t): {"model": str(p["model"]), "version": int(p["version"]), "at": float(p["at"])}
                for t, p in dict(raw.get("pins") or {}).items()}
        marks = {str(k): tuple(sorted(float(a) for a in v)) for k, v in dict(raw.get("guardMarks") or {}).items()}
        ends = {str(t): {"at": float(e["at"]), "endedAt": float(e["endedAt"]), "reason": str(e["reason"])}
                for t, e in dict(raw.get("pinEnds") or {}).items()}
        bad = {(str(t), int(v)): _timed(m) for t, by in dict(raw.get("badVersions") or {}).items()
               for v, m in dict(by).items()}
        clears = {(str(t), int(v)): _timed(c) for t, by in dict(raw.get("badVersionClears") or {}).items()
                  for v, c in dict(by).items()}
        freezes = {(str(t), float(f["at"])): {"reason": str(f["reason"]), "until": float(f["until"])}
                   for t, fs in dict(raw.get("freezes") or {}).items() for f in list(fs)}
        lifts = {str(t): _timed(lift, until=True) for t, lift in dict(raw.get("freezeLifts") or {}).items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        # Content written by something else (or a newer tailguard): never guess, never overwrite it.
        raise ClusterStateError(f"{DATA_KEY} is not a tailguard state document: {exc}") from exc
    if any("|" not in k for k in marks):
        raise ClusterStateError(f"{DATA_KEY}: guard mark keys must be 'policy|target'")
    return StateDocument(pins, marks, ends, bad, clears, freezes, lifts)


def _newest(a: Mapping[Any, Mapping[str, Any]], b: Mapping[Any, Mapping[str, Any]],
            order: Callable[[Mapping[str, Any]], Any]) -> dict[Any, Mapping[str, Any]]:
    out = dict(a)
    for key, entry in b.items():
        if key not in out or order(entry) > order(out[key]):
            out[key] = entry
    return out


def merge_documents(a: StateDocument, b: StateDocument, since: float, cap: int, *,
                    now: float | None = None, tombstone_since: float | None = None) -> StateDocument:
    """Union of two documents: the newer pin per target, dropped when an end with the same or a
    newer pin `at` is known; marks after `since`, the newest `cap` per key; the newest end, clear
    and lift per key, kept after `tombstone_since` (a lift also while what it lifted would still be
    in force at `now`); bad marks not cleared since; freezes in force at `now`, not lifted since."""
    now = time.time() if now is None else now
    keep = since if tombstone_since is None else tombstone_since
    ends = {t: e for t, e in _newest(a.ends, b.ends, lambda e: (e["at"], e["endedAt"])).items() if e["endedAt"] > keep}
    pins = {t: p for t, p in _newest(a.pins, b.pins, lambda p: p["at"]).items()
            if t not in ends or p["at"] > ends[t]["at"]}
    marks = {}
    for key in set(a.marks) | set(b.marks):
        times = sorted({t for t in (*a.marks.get(key, ()), *b.marks.get(key, ())) if t > since})
        if times:
            marks[key] = tuple(times[-cap:])
    clears = {k: c for k, c in _newest(a.clears, b.clears, lambda c: c["at"]).items() if c["at"] > keep}
    bad_all = sorted(((k, m) for k, m in _newest(a.bad, b.bad, lambda m: m["at"]).items()
                      if k not in clears or m["at"] > clears[k]["at"]), key=lambda km: -km[1]["at"])
    bad: dict[Key, Mapping[str, Any]] = {}
    per_target: dict[str, int] = {}
    for key, mark in bad_all:
        per_target[key[0]] = per_target.get(key[0], 0) + 1
        if per_target[key[0]] <= MAX_BAD_PER_TARGET:
            bad[key] = mark
    lifts = {t: lift for t, lift in _newest(a.lifts, b.lifts, lambda lift: (lift["at"], lift["until"])).items()
             if lift["at"] > keep or lift["until"] > now}
    live = sorted(((k, f) for k, f in {**a.freezes, **b.freezes}.items()
                   if f["until"] > now and (k[0] not in lifts or k[1] > lifts[k[0]]["at"])),
                  key=lambda kf: -kf[1]["until"])
    freezes: dict[tuple[str, float], Mapping[str, Any]] = {}
    per_target = {}
    for fkey, frozen in live:
        per_target[fkey[0]] = per_target.get(fkey[0], 0) + 1
        if per_target[fkey[0]] <= MAX_FREEZES_PER_TARGET:
            freezes[fkey] = frozen
    return StateDocument(pins, marks, ends, bad, clears, freezes, lifts)


def journal_document(pins: Iterable[Pin], marks: Iterable[tuple[str, str, float]],
                     shared: SharedState | None = None) -> StateDocument:
    """The document for a journal's pins, executed marks and shared state (ClusterMerge.shared_state)."""
    grouped: dict[str, list[float]] = {}
    for policy, target, at in marks:
        grouped.setdefault(f"{policy}|{target}", []).append(at)
    extra = shared or SharedState()
    return StateDocument(
        {p.target: {"model": p.model, "version": int(p.version), "at": float(p.at)} for p in pins},
        {k: tuple(sorted(v)) for k, v in grouped.items()},
        {e.target: {"at": e.at, "endedAt": e.ended_at, "reason": e.reason} for e in extra.pin_ends},
        {(m.target, m.version): {"at": m.at, "reason": m.reason} for m in extra.bad_marks},
        {(c.target, c.version): {"at": c.at, "reason": c.reason} for c in extra.bad_clears},
        {(f.target, f.at): {"reason": f.reason, "until": f.until} for f in extra.freezes},
        {lift.target: {"at": lift.at, "reason": lift.reason, "until": lift.until} for lift in extra.lifts})


def guard_horizon(policies: PolicySet) -> tuple[float, int]:
    """(seconds a mark can still block a plan, marks per key worth keeping) for the active policies."""
    guards = [p.spec.guards for p in policies.policies] or [Guards()]
    seconds = max(max(g.cooldown, g.max_actions_window) for g in guards)
    return seconds, min(max(g.max_actions for g in guards), MAX_MARKS_PER_KEY)


class ClusterState:
    """Publishes the journal's pins, guard marks, pin ends, bad versions and freezes to a ConfigMap, and
    imports them on takeover.

    Args:
        api: The Kubernetes client.
        namespace: Where the ConfigMap lives (the lease namespace).
        name: The ConfigMap's name.
        journal: This replica's journal (read for publishing, written by the import).
        metrics: `tailguard_faults_total{component="cluster_state"}` counts failures.
        horizon: (retention seconds, marks per key), usually `guard_horizon` of the active policies.
        on_change: Called when `imported` flips (the service updates its may-act gauge).
        clock: Unix time (marks are unix times).
        retry_seconds: First wait after a failed import or publish; doubles up to max_backoff_seconds.
        request_timeout_seconds: Bound on each API call.
    """

    def __init__(self, api: ApiClient, namespace: str, name: str, journal: Journal, metrics: Metrics,
                 horizon: Callable[[], tuple[float, int]], *, on_change: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.time, retry_seconds: float = 2.0,
                 max_backoff_seconds: float = 30.0, request_timeout_seconds: float = 10.0) -> None:
        self._api = CoreV1Api(api)
        self.namespace, self.name = namespace, name
        self._journal = journal
        self._metrics = metrics
        self._horizon = horizon
        self._on_change = on_change
        self._clock = clock
        self.retry_seconds = retry_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.request_timeout_seconds = request_timeout_seconds
        self.imported = False  # True once the document was merged into the journal in this leadership
        self._import_wanted = False
        self._epoch = 0  # bumped on every leadership change: a stale import result is dropped
        self._requested = 0  # publish requests seen / satisfied: pending while requested > published
        self._published = 0
        self._failures = 0
        self._wake = asyncio.Event()

    # ---- triggers (sync: called from the elector callback and the executor) -------------------

    def leadership_changed(self, leader: bool) -> None:
        """A new leader must import before acting; a follower forgets that it imported."""
        self._epoch += 1
        self._import_wanted = leader
        self._failures = 0
        self._set_imported(False)
        self._wake.set()

    def request_publish(self) -> None:
        """Something worth sharing was journaled (an executed plan, a pin)."""
        self._requested += 1
        self._wake.set()

    @property
    def publish_pending(self) -> bool:
        return self._requested > self._published

    def _set_imported(self, value: bool) -> None:
        if value != self.imported:
            self.imported = value
            self._on_change()

    # ---- loop -----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Import and publish when asked, retrying failures with a capped backoff, until `stop`."""
        while not stop.is_set():
            self._wake.clear()
            if self._import_wanted:
                ok = await self._step(self._import)
            elif self.publish_pending:
                ok = await self._step(self._publish)
            else:
                ok = True
            wait = None if ok else min(self.retry_seconds * 2 ** (self._failures - 1), self.max_backoff_seconds)
            await wait_or_stop(stop, wait, self._wake)

    async def _step(self, fn: Callable[[], Any]) -> bool:
        try:
            await fn()
        except ClusterStateError as exc:
            self._failures += 1
            self._metrics.faults.labels("cluster_state").inc()
            log.warning("cluster state step failed; will retry", step=fn.__name__.lstrip("_"),
                        error=str(exc), failures=self._failures, configmap=f"{self.namespace}/{self.name}")
            return False
        except Exception:  # a bug in one step must not end the loop (a leader would never act again)
            self._failures += 1
            self._metrics.faults.labels("cluster_state").inc()
            log.exception("cluster state step raised; will retry", step=fn.__name__.lstrip("_"))
            return False
        self._failures = 0
        return True

    async def flush(self) -> None:
        """Publish what is pending once (bounded), e.g. before handing the Lease back on stop."""
        if self.publish_pending:
            try:
                await asyncio.wait_for(self._step(self._publish), timeout=self.request_timeout_seconds)
            except asyncio.TimeoutError:  # stopping must stay bounded; the marks stay in this journal
                self._metrics.faults.labels("cluster_state").inc()
                log.warning("cluster state not published before stop", configmap=f"{self.namespace}/{self.name}")

    # ---- import ---------------------------------------------------------------------------------

    async def _import(self) -> None:
        epoch = self._epoch
        current, _ = await self._read()
        since, _ = self._since_and_cap()
        pins = [Pin(t, p["model"], p["version"], p["at"]) for t, p in current.pins.items()]
        marks = [ExecutedMark(policy, target, at) for key, times in current.marks.items()
                 for policy, target in [key.split("|", 1)] for at in times]
        try:
            counts = await self._journal.cluster.merge.in_thread(pins, marks, since, current.shared(), self._clock())
        except JournalError as exc:
            raise ClusterStateError(str(exc)) from exc
        if epoch != self._epoch:
            return  # leadership changed meanwhile; the loop decides again
        self._import_wanted = False
        self._set_imported(True)
        log.info("cluster state imported", pins_changed=counts.pins, marks_added=counts.marks,
                 shared_changed=counts.other, configmap=f"{self.namespace}/{self.name}")
        self.request_publish()  # share what only this journal knew (e.g. a publish that had failed)

    # ---- publish --------------------------------------------------------------------------------

    async def _publish(self) -> None:
        requested = self._requested
        since, cap = self._since_and_cap()
        now = self._clock()
        keep = min(since, now - TOMBSTONE_SECONDS)
        try:
            ours = journal_document(await self._journal.pins.live.in_thread(),
                                    await self._journal.decisions.executed_marks.in_thread(since),
                                    await self._journal.cluster.shared_state.in_thread(keep, now))
        except JournalError as exc:
            raise ClusterStateError(str(exc)) from exc
        for attempt in range(1, MAX_CONFLICT_RETRIES + 1):
            current, obj = await self._read()
            merged = merge_documents(current, ours, since, cap, now=now, tombstone_since=keep)
            if obj is not None and merged == merge_documents(current, StateDocument(), since, cap, now=now,
                                                             tombstone_since=keep) \
                    and DATA_KEY in (obj.data or {}):
                break  # nothing new for the cluster (pruning alone is not worth a write)
            try:
                await self._write(obj, merged)
                break
            except ApiException as exc:
                if exc.status != 409 or attempt == MAX_CONFLICT_RETRIES:
                    raise ClusterStateError(f"write refused: {exc.status} {exc.reason}") from exc
                # 409: another writer was first (or created it first); merge again from a fresh read.
                log.info("cluster state write conflict; re-reading", attempt=attempt)
        self._published = max(self._published, requested)

    async def _read(self) -> tuple[StateDocument, Any]:
        """(document, V1ConfigMap), or (empty, None) when the ConfigMap does not exist yet."""
        try:
            obj = await asyncio.wait_for(self._api.read_namespaced_config_map(self.name, self.namespace),
                                         timeout=self.request_timeout_seconds)
        except ApiException as exc:
            if exc.status == 404:
                return StateDocument(), None
            raise ClusterStateError(f"cannot read ConfigMap {self.namespace}/{self.name}: "
                                    f"{exc.status} {exc.reason}") from exc
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:  # unreachable: retried later
            raise ClusterStateError(f"cannot reach the API: {type(exc).__name__}: {exc}") from exc
        return parse_document((obj.data or {}).get(DATA_KEY)), obj

    async def _write(self, obj: Any, doc: StateDocument) -> None:
        """Create, or replace at the resourceVersion read. ApiException (409 included) propagates."""
        labels = dict((obj.metadata.labels or {}) if obj is not None else {"app.kubernetes.io/managed-by": "tailguard"})
        data = dict((obj.data or {}) if obj is not None else {}) | {DATA_KEY: doc.render()}
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace, "labels": labels}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
        try:
            if obj is None:
                await asyncio.wait_for(self._api.create_namespaced_config_map(self.namespace, body),
                                       timeout=self.request_timeout_seconds)
            else:
                metadata["resourceVersion"] = obj.metadata.resource_version
                metadata["annotations"] = dict(obj.metadata.annotations or {})
                await asyncio.wait_for(self._api.replace_namespaced_config_map(self.name, self.namespace, body),
                                       timeout=self.request_timeout_seconds)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:  # unreachable: retried later
            raise ClusterStateError(f"cannot reach the API: {type(exc).__name__}: {exc}") from exc
        except ApiException as exc:
            if exc.status == 409:
                raise  # conflict or AlreadyExists: the caller re-reads and merges again
            raise ClusterStateError(f"cannot write ConfigMap {self.namespace}/{self.name}: "
                                    f"{exc.status} {exc.reason}") from exc

    def _since_and_cap(self) -> tuple[float, int]:
        seconds, cap = self._horizon()
        return self._clock() - seconds, max(1, cap)
