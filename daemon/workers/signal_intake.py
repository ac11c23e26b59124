"""The one intake path: signals from the webhook, the detectors and the schedules are journaled
(group-committed; the journal hands new ones to the backlog), counted, and refusals mapped."""
from __future__ import annotations

import collections
import enum
from dataclasses import dataclass
from typing import Sequence

import structlog

from core.signal import Signal
from daemon.common.metrics import Metrics
from daemon.storage.errors import JournalBackpressure, JournalError, JournalValueError
from daemon.storage.journal import Journal

log = structlog.get_logger("tailguard.intake")


class Refusal(enum.Enum):
    """Why the journal took none of the signals."""

    INVALID = "invalid"
    """A value cannot be stored: the same signals fail again however often they are sent."""
    BUSY = "busy"
    """Too many signals are pending: come back later."""
    UNAVAILABLE = "unavailable"
    """The journal could not be written."""


@dataclass(frozen=True)
class Recorded:
    """What one intake call did: the new signals and duplicates, or why none was taken."""

    new: int = 0
    duplicates: int = 0
    refused: Refusal | None = None
    error: str = ""
    """The journal's one-line error when refused."""


class SignalIntake:
    """Records signals in the journal and counts them (tailguard_signals_total by source and name).

    Args:
        journal: Where signals are recorded; committed rows reach the backlog from inside it.
        metrics: The daemon's metrics.
    """

    def __init__(self, journal: Journal, metrics: Metrics) -> None:
        self._journal = journal
        self._metrics = metrics

    async def record(self, signals: Sequence[Signal], *, resent: bool) -> Recorded:
        """Journal `signals` in one group commit; never raises for the journal's refusals.

        Args:
            signals: What came in (one webhook's alerts, or one detector or schedule signal).
            resent: The sender sends refused signals again (Alertmanager, told to retry): a busy
                journal is no fault, and duplicates count as resent alerts. Otherwise (detectors,
                schedules) a refused signal is lost: counted as a journal fault and logged with it.

        Returns:
            The counts, or the refusal (with the journal's error).
        """
        try:
            new, duplicates = await self._journal.signals.intake(signals)
        except JournalError as exc:
            return self._refused(exc, signals, resent)
        if resent:
            self._metrics.alerts_deduplicated.inc(duplicates)
        for (source, name), count in collections.Counter([(s.source, s.name) for _, s in new]).items():
            self._metrics.signals.labels(source.value, name).inc(count)
        return Recorded(len(new), duplicates)

    def _refused(self, exc: JournalError, signals: Sequence[Signal], resent: bool) -> Recorded:
        refusal = (Refusal.BUSY if isinstance(exc, JournalBackpressure) else
                   Refusal.INVALID if isinstance(exc, JournalValueError) else Refusal.UNAVAILABLE)
        if not resent:  # lost: nobody sends it again
            self._metrics.faults.labels("journal").inc()
            keys = ",".join(s.dedup_key for s in signals)
            if refusal is Refusal.BUSY:
                log.warning("journal backlog full; signal dropped", error=str(exc), signal=keys)
            else:
                log.error("could not journal signal", error=str(exc), signal=keys)
        elif refusal is Refusal.BUSY:
            log.warning("backlog full; asking Alertmanager to retry", error=str(exc))
        elif refusal is Refusal.UNAVAILABLE:
            self._metrics.faults.labels("journal").inc()
            log.error("journal write failed; asking Alertmanager to retry", error=str(exc))
        return Recorded(refused=refusal, error=str(exc))
