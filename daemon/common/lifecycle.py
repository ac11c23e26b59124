"""How the daemon's long-running work starts and stops: components with `run(stop)`, run as
named, guarded tasks by one supervisor and stopped in a stated order; one periodic wait."""
from __future__ import annotations

import asyncio
import inspect
from contextlib import AsyncExitStack
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


class Supervisor:
    """Named, guarded tasks sharing one stop event, and the steps that stop them in order.

    `start` runs a component's `run(stop)` as a named task, `spawn` a one-off coroutine (work a
    takeover starts). An exception other than cancellation ends only its own task and is recorded:
    tailguard_faults_total{component=...} and one log line. `on_stop` pushes a step on an exit stack;
    `stop` sets the stop event and runs the steps last-pushed first, each even when one before failed.

    Args:
        metrics: Where a crashed task is counted.
    """

    def __init__(self, metrics: Metrics) -> None:
        self.stopping = asyncio.Event()
        """Set once stop() begins; every component's `run(stop)` gets it."""
        self._metrics = metrics
        self._stack = AsyncExitStack()
        self._tasks: dict[asyncio.Task[Any], bool] = {}  # live tasks (start order) -> cancelled by cancel_tasks

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
        return self._guard(name, component.run(self.stopping), fault or name, cancel=not joined)

    def spawn(self, name: str, work: Coroutine[Any, Any, Any], *, fault: str | None = None) -> asyncio.Task[Any]:
        """Run one-off `work` as the task `name`; cancelled by `cancel_tasks` if still running."""
        return self._guard(name, work, fault or name, cancel=True)

    def _guard(self, name: str, work: Coroutine[Any, Any, Any], fault: str, cancel: bool) -> asyncio.Task[Any]:
        task = asyncio.create_task(work, name=name)
        self._tasks[task] = cancel
        task.add_done_callback(lambda done: self._ended(done, fault))
        return task

    def _ended(self, task: asyncio.Task[Any], fault: str) -> None:
        self._tasks.pop(task, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:  # a bug in one loop: recorded; the others go on
            self._metrics.faults.labels(fault).inc()
            log.error("component crashed", component=fault, task=task.get_name(),
                      error=f"{type(exc).__name__}: {exc}", exc_info=exc)

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
