"""The control ConfigMap: freezes an operator declares with `kubectl` (the chart creates it).

Keys: `freeze` ("true" freezes the whole daemon; "false", "" or absent does not; any other value
freezes too: a kill switch fails safe), `freezeTargets` (targets `namespace/model`, separated by
spaces, commas or newlines; a bare model means `default/model`) and `freezeReason` (free text).
Who set a key is the field manager that owns it in `metadata.managedFields` (`kubectl-edit`,
`kubectl-patch`, `kubectl-client-side-apply` ...), as the API server records it on every write.

Reading is I/O (`read_control`); what the data declares is pure (`declared_freezes`); the loop
that makes the journal's freezes follow it is `ControlFollower`.
"""
from __future__ import annotations

import asyncio
import re
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Collection, Mapping, Sequence

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from daemon.common.lifecycle import wait_or_stop
from daemon.common.metrics import Metrics
from daemon.storage.errors import JournalError

log = structlog.get_logger("tailguard.service")

DAEMON_SCOPE = "*"  # as the journal's freezes row names the whole daemon
FREEZE_KEY, TARGETS_KEY, REASON_KEY = "freeze", "freezeTargets", "freezeReason"
_OFF = frozenset({"", "false", "no", "off", "0"})
_TARGET = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[^\s/]{1,253}$")


class ControlConfigMapError(Exception):
    """The ConfigMap could not be read (API error, unreachable): nothing is concluded from it."""


_EPOCH = datetime.min.replace(tzinfo=timezone.utc)


def _when(entry: Mapping[str, Any]) -> datetime:
    try:
        when = datetime.fromisoformat(str(entry.get("time")).replace("Z", "+00:00"))
    except ValueError:
        return _EPOCH
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def manager_of(key: str, managed_fields: Sequence[Mapping[str, Any]]) -> str:
    """The field manager owning `data.<key>` (the latest, when several), else the latest writer, else "unknown"."""
    entries = [e for e in managed_fields if e.get("subresource") != "status" and e.get("manager")]
    owning = [e for e in entries if f"f:{key}" in ((e.get("fieldsV1") or {}).get("f:data") or {})]
    for candidates in (owning, entries):
        if candidates:  # the latest time; on a tie (times have whole seconds) the later entry
            _, _, latest = max((_when(e), n, e) for n, e in enumerate(candidates))
            return str(latest["manager"])
    return "unknown"


def clearing_manager(scope: str, managed_fields: Sequence[Mapping[str, Any]]) -> str:
    """Who cleared `scope` (DAEMON_SCOPE: the `freeze` key; a target: `freezeTargets`): the key's
    manager, else (the key was removed) the latest writer."""
    return manager_of(FREEZE_KEY if scope == DAEMON_SCOPE else TARGETS_KEY, managed_fields)


def declared_freezes(data: Mapping[str, str], managed_fields: Sequence[Mapping[str, Any]], where: str,
                     known: Collection[str] | None = None) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(scope, reason, by) for each freeze the data declares, and one-line problems (targets skipped:
    not namespace/model, or, given the `known` targets, one no policy names: as the API refuses it,
    never a freeze that guards nothing; read again each poll, so it holds once a policy names it)."""
    why = (data.get(REASON_KEY) or "").strip() or "no reason given"
    out: list[tuple[str, str, str]] = []
    problems: list[str] = []
    value = (data.get(FREEZE_KEY) or "").strip()
    if value.lower() not in _OFF:
        by = manager_of(FREEZE_KEY, managed_fields)
        note = "" if value.lower() in ("true", "yes", "on", "1") else f" (value {value[:40]!r} read as true)"
        out.append((DAEMON_SCOPE, f"ConfigMap {where} key {FREEZE_KEY} set by {by}{note}: {why}", by))
    targets = [t for t in re.split(r"[\s,]+", data.get(TARGETS_KEY) or "") if t]
    if targets:
        by = manager_of(TARGETS_KEY, managed_fields)
        for text in dict.fromkeys(targets):
            key = text if "/" in text else f"default/{text}"
            if not _TARGET.match(key):
                problems.append(f"{TARGETS_KEY}: {text[:80]!r} is not namespace/model; skipped")
                continue
            if known is not None and key not in known:
                problems.append(f"{TARGETS_KEY}: no policy names {key} (known: {', '.join(sorted(known)) or 'none'}); "
                                "skipped")
                continue
            out.append((key, f"ConfigMap {where} key {TARGETS_KEY} set by {by}: {why}", by))
    return out, problems


async def read_control(api: ApiClient, namespace: str, name: str,
                       timeout_seconds: float) -> tuple[dict[str, str], list[dict[str, Any]]] | None:
    """(data, managedFields) of the ConfigMap, or None when it does not exist.

    Raises:
        ControlConfigMapError: any other failure (the caller keeps what it concluded before).
    """
    try:
        obj = await asyncio.wait_for(CoreV1Api(api).read_namespaced_config_map(name, namespace),
                                     timeout=timeout_seconds)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise ControlConfigMapError(f"cannot read ConfigMap {namespace}/{name}: {exc.status} {exc.reason}") from exc
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        raise ControlConfigMapError(f"cannot reach the API: {type(exc).__name__}: {exc}") from exc
    raw = api.sanitize_for_serialization(obj)
    meta = raw.get("metadata") or {}
    return dict(raw.get("data") or {}), list(meta.get("managedFields") or [])


ApplyFreezes = Callable[[list[tuple[str, str, str]], Callable[[str], str], str], Awaitable[Any]]
"""(desired (scope, reason, by), who lifted a scope, where) -> the journal agrees (FreezeControl.apply_configmap)."""


class ControlFollower:
    """Makes the journal's ConfigMap freezes follow the control ConfigMap, on the replica that acts.
    A read that fails concludes nothing (no freeze is lifted because the API was unreachable).

    Args:
        api: The Kubernetes client.
        namespace: The ConfigMap's namespace.
        name: control.configMap.
        poll_interval_seconds: control.pollIntervalSeconds (a read's timeout is at most 10 s of it).
        apply: Journals the freezes declared and lifts those cleared.
        may_act: Only the replica that acts reads and applies.
        metrics: A read or apply that fails counts under `control`.
        known_targets: The targets the policies name now (None: any namespace/model is frozen).
    """

    def __init__(self, api: ApiClient, namespace: str, name: str, poll_interval_seconds: float,
                 apply: ApplyFreezes, may_act: Callable[[], bool], metrics: Metrics,
                 known_targets: Callable[[], Collection[str]] | None = None) -> None:
        self._api = api
        self._namespace = namespace
        self._name = name
        self._interval = poll_interval_seconds
        self._apply = apply
        self._may_act = may_act
        self._metrics = metrics
        self._known_targets = known_targets

    async def run(self, stop: asyncio.Event) -> None:
        where = f"{self._namespace}/{self._name}"
        timeout = min(self._interval, 10.0)
        while not stop.is_set():
            if self._may_act():
                try:
                    read = await read_control(self._api, self._namespace, self._name, timeout)
                    data, managed = read if read is not None else ({}, [])
                    known = self._known_targets() if self._known_targets is not None else None
                    desired, problems = declared_freezes(data, managed, where, known)
                    for problem in problems:
                        log.warning("control ConfigMap entry skipped", configmap=where, problem=problem)
                    await self._apply(desired, lambda scope: clearing_manager(scope, managed), where)
                except (ControlConfigMapError, JournalError) as exc:
                    self._metrics.faults.labels("control").inc()
                    log.warning("control ConfigMap not applied; will retry", configmap=where, error=str(exc))
            await wait_or_stop(stop, self._interval)
