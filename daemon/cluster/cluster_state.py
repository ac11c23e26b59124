"""Cluster state shared between replicas through one ConfigMap: pins and guard marks (times of
executed plans), so a new leader keeps the old leader's cooldowns, rate limits and pins.

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

from daemon.storage.journal import AsyncJournal, JournalError
from daemon.common.metrics import Metrics
from policies.loader import PolicySet
from policies.schema import Guards

log = structlog.get_logger("tailguard.cluster_state")

DATA_KEY = "state.json"
FORMAT_VERSION = 1
MAX_MARKS_PER_KEY = 100  # a ConfigMap holds 1 MiB; no policy needs more marks than its maxActions
MAX_CONFLICT_RETRIES = 5


class ClusterStateError(Exception):
    """The shared document could not be read or written (API error, or content we do not understand)."""


@dataclass(frozen=True)
class StateDocument:
    """pins: {target: {model, version, at}}; marks: {"policy|target": sorted unix times}."""

    pins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    marks: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def render(self) -> str:
        return json.dumps({"version": FORMAT_VERSION, "pins": self.pins,
                           "guardMarks": {k: list(v) for k, v in self.marks.items()}},
                          sort_keys=True, separators=(",", ":"))


def parse_document(text: str | None) -> StateDocument:
    """The document stored under `state.json`; empty when absent. Raises ClusterStateError."""
    if not text:
        return StateDocument()
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
            raise ValueError(f"unknown format version {raw.get('version') if isinstance(raw, dict) else raw!r}")
        pins = {str(t): {"model": str(p["model"]), "version": int(p["version"]), "at": float(p["at"])}
                for t, p in dict(raw.get("pins") or {}).items()}
        marks = {str(k): tuple(sorted(float(a) for a in v)) for k, v in dict(raw.get("guardMarks") or {}).items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        # Content written by something else (or a newer tailguard): never guess, never overwrite it.
        raise ClusterStateError(f"{DATA_KEY} is not a tailguard state document: {exc}") from exc
    if any("|" not in k for k in marks):
        raise ClusterStateError(f"{DATA_KEY}: guard mark keys must be 'policy|target'")
    return StateDocument(pins, marks)


def merge_documents(a: StateDocument, b: StateDocument, since: float, cap: int) -> StateDocument:
    """Union of two documents: the newer pin per target; marks after `since`, the newest `cap` per key."""
    pins = dict(a.pins)
    for target, pin in b.pins.items():
        if target not in pins or pin["at"] > pins[target]["at"]:
            pins[target] = pin
    marks = {}
    for key in set(a.marks) | set(b.marks):
        times = sorted({t for t in (*a.marks.get(key, ()), *b.marks.get(key, ())) if t > since})
        if times:
            marks[key] = tuple(times[-cap:])
    return StateDocument(pins, marks)


def journal_document(pins: Iterable[Mapping[str, Any]], marks: Iterable[tuple[str, str, float]]) -> StateDocument:
    """The document for a journal's pins and executed marks."""
    grouped: dict[str, list[float]] = {}
    for policy, target, at in marks:
        grouped.setdefault(f"{policy}|{target}", []).append(at)
    return StateDocument({p["target"]: {"model": p["model"], "version": int(p["version"]), "at": float(p["at"])}
                          for p in pins},
                         {k: tuple(sorted(v)) for k, v in grouped.items()})


def guard_horizon(policies: PolicySet) -> tuple[float, int]:
    """(seconds a mark can still block a plan, marks per key worth keeping) for the active policies."""
    guards = [p.spec.guards for p in policies.policies] or [Guards()]
    seconds = max(max(g.cooldown, g.max_actions_window) for g in guards)
    return seconds, min(max(g.max_actions for g in guards), MAX_MARKS_PER_KEY)


class ClusterState:
    """Publishes the journal's pins and guard marks to a ConfigMap, and imports them on takeover.

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

    def __init__(self, api: ApiClient, namespace: str, name: str, journal: AsyncJournal, metrics: Metrics,
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
            stopping = asyncio.ensure_future(stop.wait())
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({stopping, woken}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                woken.cancel()
                await asyncio.gather(stopping, woken, return_exceptions=True)

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
        pins = [(t, p["model"], p["version"], p["at"]) for t, p in current.pins.items()]
        marks = [(policy, target, at) for key, times in current.marks.items()
                 for policy, target in [key.split("|", 1)] for at in times]
        try:
            changed, added = await self._journal.merge_cluster_state(pins, marks, since)
        except JournalError as exc:
            raise ClusterStateError(str(exc)) from exc
        if epoch != self._epoch:
            return  # leadership changed meanwhile; the loop decides again
        self._import_wanted = False
        self._set_imported(True)
        log.info("cluster state imported", pins_changed=changed, marks_added=added,
                 configmap=f"{self.namespace}/{self.name}")
        self.request_publish()  # share what only this journal knew (e.g. a publish that had failed)

    # ---- publish --------------------------------------------------------------------------------

    async def _publish(self) -> None:
        requested = self._requested
        since, cap = self._since_and_cap()
        try:
            ours = journal_document(await self._journal.pins(), await self._journal.executed_marks(since))
        except JournalError as exc:
            raise ClusterStateError(str(exc)) from exc
        for attempt in range(1, MAX_CONFLICT_RETRIES + 1):
            current, obj = await self._read()
            merged = merge_documents(current, ours, since, cap)
            if obj is not None and merged == merge_documents(current, StateDocument(), since, cap) \
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
