"""The daemon's clock: Unix time that a step of the system clock does not move.

Everything that waits or schedules inside the process counts monotonic time (asyncio's loop
clock, `time.monotonic`). What must outlive the process is stamped in Unix time (the journal's
`at` of decisions, freezes, pins, signals, recovery checks), and windows are measured against those
stamps: cooldowns, rate limits, recovery windows, a signal's age, approval deadlines, freezes.
Read from the system clock, a step forward would end those windows early (a cooldown over, a
signal expired, a recovery window closed before its samples came) and a step back would stretch
them by the step.

`SteadyClock` reads the system clock once, at start, and advances it by monotonic time from then
on: both clocks are disciplined alike by NTP's slewing, so they differ only by steps, which it
does not follow. A step is measured (`step_seconds`, the `tailguard_clock_step_seconds` gauge)
and logged; a restart adopts the system clock as it is then.
"""
from __future__ import annotations

import time
from typing import Callable

import structlog

log = structlog.get_logger("tailguard.clock")

STEP_TOLERANCE_SECONDS = 1.0
"""A difference between the system clock and the steady clock past this counts as a step (logged)."""


class SteadyClock:
    """Unix time from the system clock at start plus the monotonic time since: a callable like `time.time`.

    Args:
        wall: The system clock (tests pass one they step).
        monotonic: The monotonic clock.
    """

    def __init__(self, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._wall, self._monotonic = wall, monotonic
        self._offset = wall() - monotonic()
        self._logged = 0.0  # the step last logged

    def __call__(self) -> float:
        return self._offset + self._monotonic()

    def step_seconds(self) -> float:
        """How far the system clock has stepped since start (system minus steady; 0.0: no step).
        A change of more than STEP_TOLERANCE_SECONDS since the last one is logged."""
        step = self._wall() - self()
        if abs(step - self._logged) > STEP_TOLERANCE_SECONDS:
            log.warning("system clock stepped; the daemon's clock does not follow (a restart adopts it)",
                        step_seconds=round(step, 3), since_last_seconds=round(step - self._logged, 3))
            self._logged = step
        return step
