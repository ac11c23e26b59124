"""The plumbing every worker that acts on a target shares, in one object.

The executor, its recovery watches, the pin reconciler and the warm keeper all read the same
journal and state, lend the same clients (`ActionDeps`, the door among them: `deps.actuator`), count
in the same metrics, ask the same leadership, take the same per-target locks and report what they
journaled to the same callbacks. `ActContext` holds that once; each worker takes it instead of a
long argument list, and what is its own (timings, limits, sources) stays in its own arguments.
"""
from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from actions.base import Action, ActionDeps
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.workers.state import ExecutorState

Notify = Callable[[Mapping[str, Any]], None]  # an outcome event to send; returns at once, never blocks


def _locks() -> defaultdict[str, asyncio.Lock]:
    return defaultdict(asyncio.Lock)


@dataclass(frozen=True)
class ActContext:
    """What the workers that act share.

    Args:
        journal: Signals, decisions, steps, pins, effects, freezes, approvals.
        state: The active policies and the config's global freeze (swapped by reload and the CLI).
        deps: The clients actions use, the door (`deps.actuator`) among them.
        metrics: Decisions, actions, faults.
        actions: The action registry (kind -> class); one instance per kind is made with `deps`.
        may_act: False while this replica may not act (not the leader): no write starts.
        clock: Unix time.
        sleep: Waits (retries, the common-cause hold, recovery watches).
        on_recorded: A plan, a pin, a freeze or an approval was journaled (shared cluster state).
        notify: Hands an outcome event over (the notifier's publish); returns at once, never blocks.
        locks: Target key -> the lock that keeps one actor at a time on it (`lock_for`).
    """

    journal: Journal
    state: ExecutorState
    deps: ActionDeps
    metrics: Metrics
    actions: Mapping[str, type[Action]]
    may_act: Callable[[], bool] = lambda: True
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    on_recorded: Callable[[], None] = lambda: None
    notify: Notify = lambda event: None
    locks: defaultdict[str, asyncio.Lock] = field(default_factory=_locks, repr=False, compare=False)

    def lock_for(self, target_key: str) -> asyncio.Lock:
        """The lock that keeps one actor at a time on a target (executor, watches, pins, warm keeper)."""
        return self.locks[target_key]
