"""Runtime freezes: the whole daemon (scope `*`) or one target, set and lifted by operators through
the API, the CLI or the control ConfigMap, journaled with who and why.

A freeze is a journal row (DAEMON_SCOPE or a target key) until lifted or expired; the executor's
guard blocks every policy it covers, and the cluster state carries it to the next leader. The
ConfigMap is declarative: while it says frozen, the freeze it made holds (an API unfreeze of it is
refused with where to clear it); when it stops saying so, that freeze is lifted. Decisions here are
pure (`freeze_view`, `configmap_changes`); `FreezeControl` does the journal I/O.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import structlog
from prometheus_client import Gauge

from core.timestamps import iso_utc
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE, FOREVER, Freeze

log = structlog.get_logger("tailguard.freezes")

CONFIGMAP = "configmap"  # the source of freezes the control ConfigMap holds
CONFIGMAP_REASON_PREFIX = "ConfigMap "  # how such a freeze is recognised once imported by a new leader
_TARGET = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[^\s/]{1,253}$")


class FreezeError(Exception):
    """A freeze request that cannot be carried out as asked (HTTP 409 / 422), with a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def target_key(text: str) -> str:
    """A target as operators write it: `namespace/model`, or a bare model in `default`.

    Raises:
        ValueError: not a namespace (DNS label) and a model name without spaces or slashes.
    """
    key = text.strip()
    key = key if "/" in key else f"default/{key}"
    if not _TARGET.match(key):
        raise ValueError(f"target {text[:80]!r} is not namespace/model")
    return key


def held_by_configmap(freeze: Freeze) -> bool:
    return freeze.source == CONFIGMAP or freeze.reason.startswith(CONFIGMAP_REASON_PREFIX)


def blocking_reason(freeze: Freeze) -> str:
    """Why a decision is blocked while `freeze` (of the whole daemon or of one target) is in force:
    its reason, until when, and how to lift it."""
    until = "" if freeze.until >= FOREVER else f" (until {iso_utc(freeze.until)})"
    if freeze.target == DAEMON_SCOPE:
        return f"daemon frozen: {freeze.reason}{until}; lift with `tailguard unfreeze`"
    return f"target frozen: {freeze.reason}{until}; lift with `tailguard unfreeze {freeze.target}`"


def freeze_as_dict(freeze: Freeze, now: float) -> dict[str, Any]:
    return {"scope": freeze.target, "reason": freeze.reason, "by": freeze.by, "source": freeze.source,
            "at": iso_utc(freeze.at), "until": None if freeze.until >= FOREVER else iso_utc(freeze.until),
            "secondsLeft": None if freeze.until >= FOREVER else max(0.0, round(freeze.until - now, 1)),
            "decision": freeze.decision_id, "id": freeze.id}


@dataclass(frozen=True)
class FreezeView:
    """What is frozen now: the config's switch, a runtime freeze of the whole daemon, and targets."""

    config: bool
    daemon: Freeze | None = None
    targets: Mapping[str, Freeze] = field(default_factory=dict)  # target -> the freeze lasting longest

    @property
    def frozen(self) -> bool:
        """Whether nothing may act at all (the config's switch or a whole-daemon freeze)."""
        return self.config or self.daemon is not None

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"frozen": self.frozen, "config": self.config,
                "daemon": freeze_as_dict(self.daemon, now) if self.daemon else None,
                "targets": {t: freeze_as_dict(f, now) for t, f in sorted(self.targets.items())}}


def freeze_view(active: Iterable[Freeze], config: bool) -> FreezeView:
    """The view of the freezes in force (pure)."""
    daemon: Freeze | None = None
    targets: dict[str, Freeze] = {}
    for f in active:
        if f.target == DAEMON_SCOPE:
            daemon = f if daemon is None or f.until > daemon.until else daemon
        elif f.target not in targets or f.until > targets[f.target].until:
            targets[f.target] = f
    return FreezeView(config, daemon, targets)


@dataclass(frozen=True)
class ConfigMapChanges:
    freeze: tuple[tuple[str, str, str], ...]  # (scope, reason, by) to freeze
    lift: tuple[tuple[str, str], ...]  # (scope, by) to lift


def configmap_changes(desired: Iterable[tuple[str, str, str]], active: Iterable[Freeze],
                      lifted_by: Callable[[str], str]) -> ConfigMapChanges:
    """What to journal so the ConfigMap's freezes hold and no other of its freezes does (pure).

    Args:
        desired: (scope, reason, by) the ConfigMap declares now.
        active: The freezes in force.
        lifted_by: Who cleared a scope that is no longer declared (scope -> the key's manager).
    """
    wanted = {scope: (scope, reason, by) for scope, reason, by in desired}
    held = {f.target for f in active if held_by_configmap(f)}
    return ConfigMapChanges(tuple(wanted[s] for s in sorted(set(wanted) - held)),
                            tuple((s, lifted_by(s)) for s in sorted(held - set(wanted))))


class FreezeControl:
    """Freeze and lift through the journal; keeps the freeze gauges and the last view current.

    Args:
        config_frozen: The config's `freeze` switch (static; not lifted here).
        on_recorded: Called after a change (the cluster state publishes it).
    """

    def __init__(self, journal: Journal, metrics: Metrics, config_frozen: bool,
                 on_recorded: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.time) -> None:
        self._journal = journal
        self._metrics = metrics
        self._on_recorded = on_recorded
        self._clock = clock
        self.last = FreezeView(config_frozen)
        self._targets_gauge = Gauge("tailguard_frozen_targets",
                                    "Targets frozen now (escalation or operator), besides a whole-daemon freeze.",
                                    registry=metrics.registry)
        self._daemon_gauge = Gauge("tailguard_frozen_daemon",
                                   "1 while a runtime freeze (API, CLI, ConfigMap) stops the whole daemon.",
                                   registry=metrics.registry)

    def now(self) -> float:
        return self._clock()

    async def view(self) -> FreezeView:
        """Read what is in force now; updates `last` and the gauges. Raises JournalError."""
        self.last = freeze_view(await self._journal.freezes.active.in_thread(self._clock()), self.last.config)
        self._metrics.frozen.set(int(self.last.frozen))
        self._daemon_gauge.set(int(self.last.daemon is not None))
        self._targets_gauge.set(len(self.last.targets))
        return self.last

    async def freeze(self, scope: str, reason: str, by: str, source: str, until: float = FOREVER) -> Freeze:
        """Freeze `scope` (DAEMON_SCOPE or a target key); journaled as "<reason> (by <who> via <source>)"."""
        text = reason if source == CONFIGMAP else f"{reason} (by {by} via {source})"
        freeze_id = await self._journal.freezes.record.in_thread(scope, text, until, by=by, source=source)
        log.warning("frozen", scope=scope, reason=text, by=by, source=source,
                    until=None if until >= FOREVER else iso_utc(until))
        self._on_recorded()
        await self.view()
        return next(f for f in await self._journal.freezes.all.in_thread(scope) if f.id == freeze_id)

    async def unfreeze(self, scope: str, reason: str, by: str, source: str) -> list[Freeze]:
        """Lift the freezes in force on `scope`.

        Raises:
            FreezeError: 409 when the control ConfigMap holds one (clear it there), or nothing is frozen.
        """
        now = self._clock()
        active = [f for f in await self._journal.freezes.active.in_thread(now) if f.target == scope]
        held = [f for f in active if held_by_configmap(f)]
        if held and source != CONFIGMAP:
            raise FreezeError(409, f"{_scope_name(scope)} is frozen by the control ConfigMap ({held[0].reason}); "
                                   "clear it there")
        if not active:
            raise FreezeError(409, f"{_scope_name(scope)} is not frozen")
        lifted = await self._journal.freezes.lift.in_thread(scope, f"{reason} (by {by} via {source})", now, by=by)
        log.warning("unfrozen", scope=scope, reason=reason, by=by, source=source, lifted=[f.id for f in lifted])
        self._on_recorded()
        await self.view()
        return lifted

    async def apply_configmap(self, desired: Iterable[tuple[str, str, str]], lifted_by: Callable[[str], str],
                              where: str) -> ConfigMapChanges:
        """Make the journal agree with what the control ConfigMap declares (freeze and lift; journaled)."""
        active = await self._journal.freezes.active.in_thread(self._clock())
        changes = configmap_changes(desired, active, lifted_by)
        for scope, reason, by in changes.freeze:
            await self.freeze(scope, reason, by, CONFIGMAP)
        for scope, by in changes.lift:
            ids = [f.id for f in active if f.target == scope and held_by_configmap(f)]
            lifted = await self._journal.freezes.lift.in_thread(
                scope, f"cleared in ConfigMap {where} by {by}", self._clock(), by=by, ids=ids)
            log.warning("unfrozen", scope=scope, by=by, source=CONFIGMAP, lifted=[f.id for f in lifted])
        if changes.lift:
            self._on_recorded()
            await self.view()
        return changes


def _scope_name(scope: str) -> str:
    return "the daemon" if scope == DAEMON_SCOPE else f"target {scope}"
