"""Schedule triggers: a tick per `every` seconds becomes a signal for its policy."""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Callable

from core.signal import Signal, SignalSource
from daemon.common.lifecycle import wait_or_stop
from daemon.workers.emit import Emit
from policies.loader import PolicySet


def due_ticks(policies: PolicySet, last_tick: dict[tuple[str, int], int], now: float) -> list[Signal]:
    """Signals for every schedule trigger whose slot (floor(now / every)) has not fired yet. Pure
    except for updating `last_tick`; slots make ticks idempotent across restarts via dedup keys."""
    out = []
    for policy in policies.enabled:
        for idx, trig in enumerate(policy.spec.triggers):
            if trig.schedule is None:
                continue
            slot = int(now // trig.schedule.every)
            if last_tick.get((policy.name, idx)) == slot:
                continue
            last_tick[(policy.name, idx)] = slot
            out.append(Signal(
                source=SignalSource.SCHEDULE,
                name="schedule",
                labels={"model": policy.target.model},
                observed_at=datetime.fromtimestamp(now, timezone.utc),
                dedup_key=f"schedule:{policy.name}:{idx}:{slot}",
                policy=policy.name,
                details={"every_seconds": trig.schedule.every},
            ))
    return out


async def run_schedules(get_policies: Callable[[], PolicySet], emit: Emit, stop: asyncio.Event,
                        clock: Callable[[], float] = time.time, tick_seconds: float = 1.0) -> None:
    last: dict[tuple[str, int], int] = {}
    while not stop.is_set():
        for signal in due_ticks(get_policies(), last, clock()):
            await emit(signal)
        await wait_or_stop(stop, tick_seconds)
