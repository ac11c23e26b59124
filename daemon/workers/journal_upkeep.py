"""The journal's upkeep loops: pruning what is old, and on a journal the replicas share, watching
the backlog the others journal."""
from __future__ import annotations

import asyncio
from typing import Callable

import structlog

from daemon.common.config import JournalSettings
from daemon.common.lifecycle import wait_or_stop
from daemon.common.metrics import Metrics
from daemon.storage.errors import JournalError
from daemon.storage.journal import Journal
from daemon.storage.journal_notices import JournalNotices, notices_for
from daemon.workers.backlog import Backlog

log = structlog.get_logger("tailguard.service")
NOTICE_PAUSE_SECONDS = 0.1
"""After another replica's signals woke the leader: their group commits come in bursts; read once per pause."""


class JournalPruner:
    """Keeps the journal bounded in age and in size: a daemon runs for months, schedule ticks alone add
    1,440 a day, and an alert storm adds a decision per signal and policy in minutes.

    Args:
        journal: The journal.
        metrics: Failed prunes count as faults under `journal`.
        settings: retentionDays, maxHistoryRows, pruneIntervalSeconds.
        clock: Unix time.
        guarded_seconds: How far back the guards count (cooldown, maxActions windows, the target budget,
            common cause): what is newer is never pruned for size. None: retentionDays' day minimum.
    """

    def __init__(self, journal: Journal, metrics: Metrics, settings: JournalSettings,
                 clock: Callable[[], float], guarded_seconds: Callable[[], float] | None = None) -> None:
        self._journal = journal
        self._metrics = metrics
        self._settings = settings
        self._clock = clock
        self._guarded_seconds = guarded_seconds or (lambda: 86400.0)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.prune_once()
            await wait_or_stop(stop, self._settings.prune_interval_seconds)

    async def prune_once(self) -> dict[str, int]:
        """One prune by age, then by size; the rows deleted (a failure is recorded, not raised)."""
        settings, now = self._settings, self._clock()
        pruned: dict[str, int] = {}
        try:
            pruned = await self._journal.prune.in_thread(now - settings.retention_days * 86400)
            if any(pruned.values()):
                log.info("journal pruned", retention_days=settings.retention_days, **pruned)
            sized = await self._journal.prune_to_size.in_thread(settings.max_history_rows,
                                                                now - self._guarded_seconds())
            if any(sized.values()):
                log.warning("journal pruned to its size bound", max_history_rows=settings.max_history_rows, **sized)
            pruned = {k: pruned.get(k, 0) + sized.get(k, 0) for k in {*pruned, *sized}}
        except JournalError as exc:  # a busy journal is pruned next time; recorded, not fatal
            self._metrics.faults.labels("journal").inc()
            log.warning("journal prune failed", error=str(exc))
        return pruned


class SharedJournalWatch:
    """On a journal the replicas share: recount the backlog (every replica, for backpressure) and,
    on the leader, take the signals other replicas journaled. A failed read is recorded and tried
    again next round.

    Args:
        journal: The shared journal.
        metrics: Faults are counted under `journal`.
        backlog: Told the pending count (`look_again`).
        may_act: Whether this replica acts (only then it listens for the others' notices).
        interval_seconds: journal.sharedPollSeconds.
    """

    def __init__(self, journal: Journal, metrics: Metrics, backlog: Backlog, may_act: Callable[[], bool],
                 interval_seconds: float) -> None:
        self._journal = journal
        self._metrics = metrics
        self._backlog = backlog
        self._may_act = may_act
        self._interval = interval_seconds
        self._acting_flipped = asyncio.Event()  # the loop looks again at once

    def acting_flipped(self) -> None:
        """may_act() flipped: a new leader reads the backlog and starts listening at once."""
        self._acting_flipped.set()

    async def run(self, stop: asyncio.Event) -> None:
        notices = notices_for(self._journal)
        try:
            while not stop.is_set():
                self._acting_flipped.clear()  # before the look: a flip during it cuts the next wait short
                if notices is not None and self._may_act():
                    await self._listen(notices)  # before the count: a commit after it is heard, one before counted
                try:
                    pending = await self._journal.signals.refresh_pending.in_thread()
                    if self._backlog.look_again(pending):
                        log.debug("signals journaled by other replicas; reading the pending set", pending=pending)
                except JournalError as exc:
                    self._metrics.faults.labels("journal").inc()
                    log.warning("could not count pending signals in the shared journal", error=str(exc))
                await self._until_next_look(stop, notices)
        finally:
            if notices is not None:
                await notices.close()

    async def _until_next_look(self, stop: asyncio.Event, notices: JournalNotices | None) -> None:
        """The poll interval, cut short by a change of acting and, on the leader of a PostgreSQL
        journal, by another replica's committed signals (then a short pause, so that a burst of
        them is read once)."""
        interval = self._interval
        heard = asyncio.ensure_future(notices.wait(interval)) if notices is not None and self._may_act() else None
        try:
            await wait_or_stop(stop, interval, self._acting_flipped, *([heard] if heard is not None else []))
        finally:
            if heard is not None:
                heard.cancel()
                await asyncio.gather(heard, return_exceptions=True)
        if heard is None or heard.cancelled():
            return
        try:
            noticed = heard.result()
        except JournalError as exc:  # the poll goes on; the next round connects again
            self._notices_failed(exc)
            await wait_or_stop(stop, interval)
            return
        if noticed:
            await wait_or_stop(stop, NOTICE_PAUSE_SECONDS)

    async def _listen(self, notices: JournalNotices) -> None:
        try:
            await notices.listen()
        except JournalError as exc:  # the wait after the count tries again; the poll goes on meanwhile
            self._notices_failed(exc)

    def _notices_failed(self, exc: JournalError) -> None:
        self._metrics.faults.labels("journal").inc()
        log.warning("journal notices failed; polling the shared backlog meanwhile", error=str(exc))


class JournalProbe:
    """Keeps the journal's write health current (`Journal.write_health`): a replica that wrote
    nothing for `interval_seconds` runs an empty write transaction, so a journal that went away
    (a stalled or lost database connection, an unwritable file) is seen before a signal needs it:
    the replica turns not ready and, as leader, hands its Lease on (daemon/cluster/leader.py).
    `tailguard_journal_up` says how the last write or probe fared.

    Args:
        journal: The journal.
        metrics: `journal_up`; failed probes count as faults under `journal`.
        interval_seconds: journal.probeIntervalSeconds.
        trouble: Why the journal counts as unavailable now (None: it does not), as the service judges it.
    """

    def __init__(self, journal: Journal, metrics: Metrics, interval_seconds: float,
                 trouble: Callable[[], str | None]) -> None:
        self._journal = journal
        self._metrics = metrics
        self._interval = interval_seconds
        self._trouble = trouble
        self._reported: str | None = None
        # Read at each scrape: a probe stalled in its thread must not leave the gauge behind.
        metrics.journal_up.set_function(lambda: 0.0 if trouble() else 1.0)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._journal.seconds_since_write() >= self._interval or self._journal.write_health().error:
                try:
                    await asyncio.to_thread(self._journal.probe)
                except JournalError as exc:  # the health it leaves behind is what counts
                    self._metrics.faults.labels("journal").inc()
                    log.debug("journal probe failed", error=str(exc))
            self.report()
            await wait_or_stop(stop, self._interval)

    def report(self) -> None:
        """Log when the journal turns unavailable or comes back."""
        trouble = self._trouble()
        if trouble and not self._reported:
            log.error("journal unavailable: not ready; a leader steps down", reason=trouble)
        elif self._reported and not trouble:
            log.info("journal writes succeed again")
        self._reported = trouble
