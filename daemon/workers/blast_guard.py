"""Daemon-wide guards across targets, for the executor: the target budget and common-cause
suppression (the decisions are pure, in policies/blast_radius.py; this module reads the journal).

Common cause needs to see a burst before acting on any of it: with it on, every matching signal is
held for commonCauseSpanSeconds first, then judged on the signals of the span before and after its
arrival. That delay is the price of "act on none"; both limits are off by default.
"""
from __future__ import annotations

import time
from typing import Awaitable, Callable

import structlog

from core.signal import Signal
from daemon.common.config import BlastRadiusSettings
from daemon.storage.journal import AsyncJournal
from daemon.workers.shadow import shadow_origin
from daemon.workers.state import ExecutorState
from policies.blast_radius import CommonCauseDecision, check_common_cause, check_target_budget
from policies.guards import GuardDecision
from policies.loader import LoadedPolicy
from policies.matching import matching_policies

log = structlog.get_logger("tailguard.blast_radius")


class BlastGuard:
    """Reads recent signals and executed plans from the journal and applies the pure checks."""

    def __init__(self, journal: AsyncJournal, state: ExecutorState, settings: BlastRadiusSettings,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] | None = None) -> None:
        self._journal = journal
        self._state = state
        self.settings = settings
        self._clock = clock
        self._sleep = sleep
        self._last_suppressed_at: float | None = None  # escalate once per burst (this process)

    @property
    def common_cause_on(self) -> bool:
        return self.settings.common_cause_targets is not None or self.settings.common_cause_share is not None

    async def hold(self) -> None:
        """Wait out the span so that the rest of a burst is journaled before this signal is judged."""
        if self.common_cause_on and self._sleep is not None:
            await self._sleep(self.settings.common_cause_span_seconds)

    async def check(self, policy: LoadedPolicy, *, commit: bool) -> GuardDecision | None:
        """A blocking decision, or None when both checks pass. `commit` False (a preview) leaves
        the escalate-once memory alone."""
        s, now = self.settings, self._clock()
        if self.common_cause_on:
            span = s.common_cause_span_seconds
            # A held signal arrived a span ago: its burst is the span before and after its arrival.
            recent = await self._signal_targets(now - 2 * span)
            cause = check_common_cause(
                recent + [(policy.target.key, now)], now, 2 * span, s.common_cause_targets,
                s.common_cause_share, policy_targets=len({p.target.key for p in self._state.policies.policies}),
                last_suppressed_at=self._last_suppressed_at)
            if not cause.allowed:
                if commit:
                    self._last_suppressed_at = now  # before any await: parallel workers escalate once
                return cause
        if s.max_targets_per_window is not None:
            executed = await self._journal.executed_marks(now - s.window_seconds)
            budget = check_target_budget([(target, at) for _, target, at in executed], policy.target.key, now,
                                         s.window_seconds, s.max_targets_per_window)
            if not budget.allowed:
                return budget
        return None

    async def _signal_targets(self, since: float) -> list[tuple[str, float]]:
        """(target, journaled at) of every signal since `since`, mapped to targets by the policies."""
        out: list[tuple[str, float]] = []
        for row in await self._journal.signals_since(since):
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
