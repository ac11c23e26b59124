"""Daemon-wide guards across targets, for the executor: the target budget and common-cause
suppression (the decisions are pure, in policies/blast_radius.py; this module reads the journal).

Common cause needs to see a burst before acting on any of it: with it on, every matching signal is
held until commonCauseSpanSeconds after its *arrival* (when the journal received it), then judged on
the signals that arrived within a span before and after that arrival, whichever worker journaled or
takes them and however late a worker gets to it: a burst of 20 targets taken four at a time by four
workers is one burst for every one of them. A signal taken later than a span after its arrival is
not held again. That delay is the price of "act on none".

A lone signal is not held the whole span: after quietHoldSeconds, a signal on whose arrival no other
target signalled (from a span before it until now) is judged at once. A regression arrives with one
deploy of one model, and a common cause (a node, the network, Prometheus) reaches many targets at the
same moment, so the next target of a burst signals within seconds: a deploy's rollback waits the
short hold, a burst is still held the span and acted on by none.

Escalate once: the first suppressed signal of a burst escalates; one whose arrival lies within a
span of an arrival already suppressed (by any worker of this process) does not.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import replace
from typing import Awaitable, Callable, Collection

import structlog

from core.signal import Signal
from daemon.common.config import BlastRadiusSettings
from daemon.storage.journal import Journal
from daemon.workers.shadow import shadow_origin
from daemon.workers.state import ExecutorState
from policies.blast_radius import CommonCauseDecision, check_common_cause, check_target_budget
from policies.guards import GuardDecision
from policies.loader import LoadedPolicy
from policies.matching import matching_policies

log = structlog.get_logger("tailguard.blast_radius")

MAX_REMEMBERED = 10_000
"""Suppressed arrivals kept for escalate-once; older ones are forgotten first (a burst far older
than the span escalates again, at worst)."""


class BlastGuard:
    """Reads recent signals and executed plans from the journal and applies the pure checks."""

    def __init__(self, journal: Journal, state: ExecutorState, settings: BlastRadiusSettings,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] | None = None) -> None:
        self._journal = journal
        self._state = state
        self.settings = settings
        self._clock = clock
        self._sleep = sleep
        # Arrival times of the suppressed signals, sorted: escalate once per burst (this process).
        self._suppressed: list[float] = []

    @property
    def common_cause_on(self) -> bool:
        return self.settings.common_cause_targets is not None or self.settings.common_cause_share is not None

    async def hold(self, signal_id: int, targets: Collection[str] = ()) -> float | None:
        """Wait until a span has passed since the signal arrived, so that the rest of its burst is
        journaled before it is judged (only quietHoldSeconds when no target but its own `targets`
        signalled around it by then); returns its arrival (unix time), None when common cause is off.
        A signal the journal no longer has counts as arriving now."""
        if not self.common_cause_on:
            return None
        row = await self._journal.signals.get.in_thread(signal_id)
        arrived = row.received_at if row is not None else self._clock()
        span = self.settings.common_cause_span_seconds
        quiet = self.settings.quiet_hold_seconds
        if quiet is not None and quiet < span:
            await self._wait_until(arrived, quiet)
            others = {t for t, _ in await self._signal_targets(arrived - span)} - set(targets)
            if not others:  # alone so far: no burst to wait for
                return arrived
        await self._wait_until(arrived, span)
        return arrived

    async def _wait_until(self, arrived: float, seconds: float) -> None:
        """Sleep until `seconds` after `arrived`; never more than `seconds` (an arrival stamped by a
        replica whose clock runs ahead holds no longer)."""
        wait = min(seconds, arrived + seconds - self._clock())
        if wait > 0 and self._sleep is not None:
            await self._sleep(wait)

    async def check(self, policy: LoadedPolicy, *, commit: bool,
                    arrived_at: float | None = None) -> GuardDecision | None:
        """A blocking decision, or None when both checks pass. `arrived_at`: when the signal arrived
        (None: now, e.g. a preview). `commit` False (a preview) leaves the escalate-once memory alone."""
        s, now = self.settings, self._clock()
        if self.common_cause_on:
            span = s.common_cause_span_seconds
            arrived = now if arrived_at is None else arrived_at
            # Its burst: every signal that arrived within a span before or after it.
            recent = [(target, at) for target, at in await self._signal_targets(arrived - span)
                      if at <= arrived + span]
            cause = check_common_cause(
                recent + [(policy.target.key, arrived)], arrived + span, 2 * span, s.common_cause_targets,
                s.common_cause_share, policy_targets=len({p.target.key for p in self._state.policies.policies}))
            if not cause.allowed:
                # The memory is read and written with no await between: parallel workers escalate once.
                first = not self._suppressed_near(arrived, span)
                if commit:
                    self._remember_suppressed(arrived)
                return replace(cause, escalate=first)
        if s.max_targets_per_window is not None:
            executed = await self._journal.decisions.executed_marks.in_thread(now - s.window_seconds)
            budget = check_target_budget([(target, at) for _, target, at in executed], policy.target.key, now,
                                         s.window_seconds, s.max_targets_per_window)
            if not budget.allowed:
                return budget
        return None

    def _suppressed_near(self, arrived: float, span: float) -> bool:
        """Whether a suppressed signal arrived within `span` of `arrived` (the same burst)."""
        i = bisect.bisect_left(self._suppressed, arrived - span)
        return i < len(self._suppressed) and self._suppressed[i] <= arrived + span

    def _remember_suppressed(self, arrived: float) -> None:
        bisect.insort(self._suppressed, arrived)
        if len(self._suppressed) > MAX_REMEMBERED:
            del self._suppressed[: len(self._suppressed) - MAX_REMEMBERED]  # the oldest arrivals

    async def _signal_targets(self, since: float) -> list[tuple[str, float]]:
        """(target, journaled at) of every signal since `since`, mapped to targets by the policies."""
        out: list[tuple[str, float]] = []
        for row in await self._journal.signals.since.in_thread(since):
            try:
                signal = Signal.from_summary(row.payload)
            except (KeyError, ValueError) as exc:  # a row this version cannot read counts for nothing
                log.warning("unreadable signal left out of the common-cause count", signal_id=row.id,
                            error=str(exc))
                continue
            # A shadow trigger never acts, so it never makes a live burst look like a common cause.
            out.extend((p.target.key, row.received_at)
                       for p in matching_policies(self._state.policies.policies, signal)
                       if shadow_origin(p, signal) is None)
        return out


def escalates(decision: GuardDecision) -> bool:
    """Whether a blocking decision is the first suppression of a common-cause burst."""
    return isinstance(decision, CommonCauseDecision) and decision.escalate
