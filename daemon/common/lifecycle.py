"""How the daemon's long-running work starts and stops: components with `run(stop)`, run as
named, guarded tasks by one supervisor (a crashed loop restarts with backoff, and a loop that keeps
crashing makes the replica unhealthy) and stopped in a stated order; one periodic wait."""
from __future__ import annotations

import asyncio
import inspect
import time
from collections import deque
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Coroutine, Protocol

import structlog

from daemon.common.metrics import Metrics

log = structlog.get_logger("tailguard.lifecycle")


async def wait_or_stop(stop: asyncio.Event, seconds: float | None,
                       *also: asyncio.Event | asyncio.Future[Any]) -> bool:
    """Wait until `stop` is set, `seconds` passed (None: no bound), or one of `also` is set or done.

    Args:
        stop: The stop event every loop of the daemon shares.
        seconds: The longest wait.
        also: Events that end the wait early (a wake-up), or futures the caller owns (never
            cancelled here; the caller reads or cancels them).

    Returns:
        Whether `stop` is set: a loop ends on True.
    """
    if stop.is_set():
        return True
    if not also:
        try:
            async with asyncio.timeout(seconds):
                await stop.wait()
        except TimeoutError:
            pass
        return stop.is_set()
    waiters = [asyncio.ensure_future(event.wait()) for event in (stop, *also) if isinstance(event, asyncio.Event)]
    futures = [f for f in also if not isinstance(f, asyncio.Event)]
    try:
        await asyncio.wait([*waiters, *futures], timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    return stop.is_set()


class Component(Protocol):
    """A loop of the daemon: runs until `stop` is set (or it is cancelled)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set; a wait between rounds is `wait_or_stop(stop, seconds)`."""


class Loop:
    """A component from a coroutine function of the stop event: a loop written as a function, or
    one that ignores stop and ends only when cancelled (the backlog's workers)."""

    def __init__(self, run: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        self._run = run

    async def run(self, stop: asyncio.Event) -> None:
        await self._run(stop)


StopStep = Callable[[], Awaitable[None] | None]
Spawn = Callable[[str, Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]
"""Starts a component's child task (a poll of one query group, a recovery watch) by name: the
supervisor's `child`, or a plain `asyncio.create_task` where a component runs without one."""


def plain_spawn(name: str, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """A Spawn without a supervisor (tests, tools): the task alone, its crash left to its owner."""
    return asyncio.create_task(work, name=name)


@dataclass(frozen=True)
class RestartPolicy:
    """How the supervisor restarts a crashed loop, and when a loop that keeps crashing makes the
    replica unhealthy (not ready, not leading, not live: Kubernetes restarts the pod)."""

    initial_seconds: float = 1.0
    """The wait before the first restart; it doubles with each crash of the loop in the window."""
    max_seconds: float = 60.0
    """The longest wait before a restart."""
    max_crashes: int = 5
    """Crashes of one component within window_seconds at which the replica turns unhealthy."""
    window_seconds: float = 300.0
    """The window of max_crashes (a crash older than this no longer counts)."""

    def __post_init__(self) -> None:
        if not (0 < self.initial_seconds <= self.max_seconds and self.max_crashes >= 1 and self.window_seconds > 0):
            raise ValueError("need 0 < initial <= max, max_crashes >= 1 and window > 0")

    def backoff(self, crashes: int) -> float:
        """The wait before restarting a loop that crashed `crashes` times in the window (at least 1)."""
        return min(self.max_seconds, self.initial_seconds * 2.0 ** (max(crashes, 1) - 1))


class Supervisor:
    """Named, guarded tasks sharing one stop event, and the steps that stop them in order.

    `start` runs a component's `run(stop)` as a named task and restarts it when it crashes, after
    `restart.backoff` (1 s, 2 s, 4 s ... at most 60 s); `spawn` runs a one-off coroutine (work a
    takeover starts), `child` a component's own child task (a poll of one group, a recovery watch,
    an approval's wait). A crash (an exception other than cancellation) never ends another task: it
    is counted, tailguard_loop_crashes_total{component=...} (and tailguard_faults_total, but for a
    child, whose owner counts its own), and logged once. At `restart.max_crashes` crashes of one
    component within `restart.window_seconds`, `trouble` names it: the service then answers /readyz
    and /healthz 503 and a leader hands its Lease back. An outage (`outages`: the journal's errors)
    is no crash: restarted and counted as a fault the same way, it spends no crash budget, since a
    new pod would find the same database down (the journal's own health says it, in /readyz).
    `on_stop` pushes a step on an exit stack; `stop` sets the stop event and runs the steps
    last-pushed first, each even when one before failed.

    Args:
        metrics: Where a crash is counted.
        restart: The backoff and the crash budget.
        clock: Monotonic seconds (the crash window).
        outages: Exception types that say a dependency is down, not that the code is broken.
    """

    def __init__(self, metrics: Metrics, restart: RestartPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 outages: tuple[type[BaseException], ...] = ()) -> None:
        self.stopping = asyncio.Event()
        """Set once stop() begins; every component's `run(stop)` gets it."""
        self._metrics = metrics
        self.restart = restart or RestartPolicy()
        self._clock = clock
        self._stack = AsyncExitStack()
        self._tasks: dict[asyncio.Task[Any], bool] = {}  # live tasks (start order) -> cancelled by cancel_tasks
        self._crashes: dict[str, deque[float]] = {}  # component -> times of its crashes in the window
        self._outages = outages
        self._outage_times: dict[str, deque[float]] = {}  # component -> its outage failures (backoff only)
        self._last_error: dict[str, str] = {}

    @property
    def tasks(self) -> list[asyncio.Task[Any]]:
        """The tasks still running, in the order they started."""
        return list(self._tasks)

    def task(self, name: str) -> asyncio.Task[Any] | None:
        """The running task of that name, if any."""
        return next((t for t in self._tasks if t.get_name() == name), None)

    def start(self, name: str, component: Component, *, fault: str | None = None,
              joined: bool = False) -> asyncio.Task[None]:
        """Run `component.run(stop)` as the task `name`.

        Args:
            name: The task's name (in logs and for tests).
            component: What runs.
            fault: The `component` label a crash is counted under (default: `name`).
            joined: It ends by itself once stop is set (the leader elector hands its Lease back):
                `cancel_tasks` leaves it to a stop step that calls `join`.
        """
        return self._guard(name, self._restarting(name, component, fault or name), fault or name,
                           cancel=not joined)

    def spawn(self, name: str, work: Coroutine[Any, Any, Any], *, fault: str | None = None) -> asyncio.Task[Any]:
        """Run one-off `work` as the task `name`; cancelled by `cancel_tasks` if still running."""
        return self._guard(name, work, fault or name, cancel=True)

    def child(self, name: str, work: Coroutine[Any, Any, Any], *, fault: str, logged: bool = False) -> asyncio.Task[Any]:
        """Run a component's child task `name` (a Spawn, with `fault` bound): its crash counts in the
        component `fault`'s crash budget. The owner stops its children (`cancel_tasks` leaves them: a
        notifier flushes at stop) and, unless `logged`, reads the task's result, logs a crash and
        counts its fault; with `logged` the supervisor does (an owner that only drops done tasks)."""
        return self._guard(name, work, fault, cancel=False, owned=not logged)

    def _guard(self, name: str, work: Coroutine[Any, Any, Any], fault: str, cancel: bool,
               owned: bool = False) -> asyncio.Task[Any]:
        task = asyncio.create_task(work, name=name)
        self._tasks[task] = cancel
        task.add_done_callback(lambda done: self._ended(done, fault, owned))
        return task

    def _ended(self, task: asyncio.Task[Any], fault: str, owned: bool) -> None:
        self._tasks.pop(task, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:  # a bug in one task: recorded; the others go on
            self._crashed(fault, task.get_name(), exc, logged=not owned)

    async def _restarting(self, name: str, component: Component, fault: str) -> None:
        """Run the component until it ends by itself; after a crash, wait the backoff and run it again."""
        while True:
            try:
                await component.run(self.stopping)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a crashed loop restarts: a loop that stays dead never acts again
                crashes = self._crashed(fault, name, exc, logged=True)
            delay = self.restart.backoff(crashes)
            log.warning("restarting crashed component", component=fault, task=name, crashes_in_window=crashes,
                        restart_in_seconds=delay)
            if await wait_or_stop(self.stopping, delay):
                return

    def _crashed(self, fault: str, task: str, exc: BaseException, *, logged: bool) -> int:
        """Count one crash of `fault` (an outage: one failure); returns its crashes (failures) within
        the window, which set the backoff."""
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, self._outages):
            if logged:
                self._metrics.faults.labels(fault).inc()
                log.warning("component failed on an outage", component=fault, task=task, error=error)
            self._outage_times.setdefault(fault, deque()).append(self._clock())
            return self._in_window(fault, self._outage_times)
        self._metrics.loop_crashes.labels(fault).inc()
        if logged:
            self._metrics.faults.labels(fault).inc()
            log.error("component crashed", component=fault, task=task, error=error, exc_info=exc)
        self._crashes.setdefault(fault, deque()).append(self._clock())
        self._last_error[fault] = error
        return self._in_window(fault)

    def _in_window(self, fault: str, where: dict[str, deque[float]] | None = None) -> int:
        times = (self._crashes if where is None else where).get(fault)
        if not times:
            return 0
        horizon = self._clock() - self.restart.window_seconds
        while times and times[0] <= horizon:
            times.popleft()
        return len(times)

    def crash_counts(self) -> dict[str, int]:
        """Crashes within the window, per component that has any (for /readyz)."""
        counts = {fault: self._in_window(fault) for fault in list(self._crashes)}
        return {fault: n for fault, n in sorted(counts.items()) if n}

    def trouble(self) -> str | None:
        """Why this replica counts as failing: a component that crashed `restart.max_crashes` times
        within the window (None: none did). Never blocks."""
        worst = max(self.crash_counts().items(), key=lambda item: item[1], default=None)
        if worst is None or worst[1] < self.restart.max_crashes:
            return None
        fault, crashes = worst
        return (f"{fault} crashed {crashes} times in {self.restart.window_seconds:g}s "
                f"(limit {self.restart.max_crashes}): {self._last_error.get(fault, '')}")

    def on_stop(self, step: StopStep) -> None:
        """Run `step` when stopping, before every step pushed earlier (a LIFO stack)."""
        async def run() -> None:
            result = step()
            if inspect.isawaitable(result):
                await result

        self._stack.push_async_callback(run)

    def on_stop_in_order(self, *steps: StopStep) -> None:
        """Run `steps` when stopping, in the order given, before every step pushed earlier and
        after every step pushed later."""
        for step in reversed(steps):
            self.on_stop(step)

    async def cancel_tasks(self) -> None:
        """Cancel every running task but the joined ones and wait until they ended."""
        cancelled = [task for task, cancel in self._tasks.items() if cancel]
        for task in cancelled:
            task.cancel()
        await asyncio.gather(*cancelled, return_exceptions=True)

    @staticmethod
    async def join(task: asyncio.Task[Any] | None, timeout_seconds: float) -> None:
        """Wait up to `timeout_seconds` for a task that ends by itself; then it is cancelled."""
        if task is None:
            return
        try:
            await asyncio.wait_for(task, timeout=timeout_seconds)
        except (asyncio.TimeoutError, asyncio.CancelledError):  # bounded: stopping must not hang
            pass

    async def stop(self) -> None:
        """Set the stop event and run the stop steps, last-pushed first (once: a second call only
        finds the stack empty)."""
        self.stopping.set()
        await self._stack.aclose()
