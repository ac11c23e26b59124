"""Outcome notifications: fire-and-forget POSTs of what tailguard did and whether it helped.

`Notifier.publish(event)` never blocks and never raises: the event joins the bounded in-memory queue
of every receiver subscribed to its kind, and each receiver has its own sender task (started on
demand): a receiver that hangs or is down delays its own notifications only, never another
receiver's and never a remediation. 5xx answers and network errors are retried with backoff; other
answers are given up at once.

Escalations first: `escalated`, `failed` and `not_recovered` are urgent, sent before the routine
`acted` and `recovered` waiting for the same receiver; when a receiver's queue is full a routine
notice is dropped first (the oldest), an urgent one only when nothing routine is left (then the
oldest urgent; a routine event arriving at a queue full of urgent ones is itself dropped). Every
drop is counted in `tailguard_faults_total{component="notifications"}`. Each POST carries
`Idempotency-Key: <decision>/<event>` so a receiver can drop the repeat of a retried delivery.

Events (`event` in the JSON): acted, recovered, not_recovered (verdict not_recovered or unknown),
escalated, failed.

A receiver's `urlFile` (a mounted Secret key: chat webhook URLs are secrets) is read once, when the
notifier is built; such a URL is never logged, the file's path is named instead.
"""
from __future__ import annotations

import asyncio
from collections import deque
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence

import aiohttp
import structlog

from actions.base import IDEMPOTENCY_HEADER
from daemon.common.config import ConfigError, NotificationSettings
from daemon.common.lifecycle import Spawn, plain_spawn
from daemon.common.metrics import Metrics

log = structlog.get_logger("tailguard.notifier")

FAULT = "notifications"  # the faults counter's component for drops and deliveries given up


def slack_text(event: Mapping[str, Any]) -> str:
    """One line for a chat message."""
    where = f"{event.get('policy', '?')} on {event.get('target', '?')}"
    return f"tailguard {event.get('event', '?')}: {where}: {event.get('message', '')}".rstrip(": ")


def read_url_file(path: Path) -> str:
    """The receiver URL held in `path` (surrounding whitespace dropped).

    Raises:
        ConfigError: the file cannot be read or does not hold an http(s):// URL (one line; the
            content is never quoted, it is a secret).
    """
    try:
        url = path.read_text(encoding="utf-8").strip()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read notification URL file {path}: {exc}") from exc
    if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
        raise ConfigError(f"notification URL file {path} does not hold one http:// or https:// URL")
    return url


def _resolved(sink: NotificationSettings) -> NotificationSettings:
    """`sink` with `url` filled in from `urlFile` (unchanged when it has a url)."""
    if sink.url_file is None:
        return sink
    return sink.model_copy(update={"url": read_url_file(sink.url_file)})


def _where(sink: NotificationSettings) -> str:
    """How a receiver is named in logs: its URL, or for a secret URL the file holding it."""
    return f"<{sink.url_file}>" if sink.url_file is not None else str(sink.url)


URGENT = frozenset({"escalated", "failed", "not_recovered"})
"""Events a human must see: sent first, dropped last."""


class _Lane:
    """One receiver's queue (urgent and routine) and its sender task."""

    def __init__(self, sink: NotificationSettings) -> None:
        self.sink = sink
        self.urgent: deque[dict[str, Any]] = deque()
        self.routine: deque[dict[str, Any]] = deque()
        self.task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.urgent) + len(self.routine)

    def admit(self, event: dict[str, Any], size: int) -> dict[str, Any] | None:
        """Queue `event`; the event dropped to make room (None: none was)."""
        urgent = event.get("event") in URGENT
        lost = None
        if len(self) >= size:
            if self.routine:
                lost = self.routine.popleft()
            elif urgent:
                lost = self.urgent.popleft()
            else:
                return event  # only urgent ones wait: the routine newcomer gives way
        (self.urgent if urgent else self.routine).append(event)
        return lost

    def take(self) -> dict[str, Any]:
        return (self.urgent or self.routine).popleft()


class Notifier:
    """Sends outcome events to the configured receivers, in the background, one sender per receiver.

    Args:
        sinks: The receivers (`notifications` in the settings).
        metrics: Drops and deliveries given up are counted as faults.
        queue_size: Events waiting at most per receiver; past it a routine one is dropped first.
        sleep: Waits between retries (tests pass a fast one).
        backoff_seconds: The first retry's delay; each next one doubles it.

    Raises:
        ConfigError: a receiver's urlFile cannot be read or holds no URL.
    """

    def __init__(self, sinks: Sequence[NotificationSettings], metrics: Metrics, queue_size: int = 1000,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, backoff_seconds: float = 1.0) -> None:
        self._sinks = tuple(_resolved(sink) for sink in sinks)
        self._metrics = metrics
        self._size = queue_size
        self._sleep = sleep
        self._backoff = backoff_seconds
        self.spawn: Spawn = plain_spawn  # the service hands the supervisor's: a crash is counted and logged
        self._lanes = tuple(_Lane(sink) for sink in self._sinks)
        self._http: aiohttp.ClientSession | None = None
        self.dropped = 0  # (event, receiver) deliveries dropped because the receiver's queue was full
        self.delivered = 0  # (event, receiver) deliveries that succeeded
        self.given_up = 0  # (event, receiver) deliveries that failed for good

    @property
    def pending(self) -> int:
        """(event, receiver) deliveries waiting."""
        return sum(len(lane) for lane in self._lanes)

    def _tasks(self) -> list[asyncio.Task[None]]:
        return [lane.task for lane in self._lanes if lane.task is not None and not lane.task.done()]

    def publish(self, event: Mapping[str, Any]) -> None:
        """Queue `event` for the receivers subscribed to `event["event"]`; returns at once, never raises."""
        try:
            lanes = [lane for lane in self._lanes if event.get("event") in lane.sink.events]
            if not lanes:
                return
            asyncio.get_running_loop()  # outside a loop this raises here, before a lane's coroutine is made
            for lane in lanes:
                lost = lane.admit(dict(event), self._size)
                if lost is not None:
                    self.dropped += 1
                    self._metrics.faults.labels(FAULT).inc()
                    log.warning("notification queue full; one dropped (routine before urgent)",
                                url=_where(lane.sink), dropped=lost.get("event"), decision=lost.get("decision"),
                                queue_size=self._size)
                if lane.task is None or lane.task.done():
                    lane.task = self.spawn(f"notifier-{_where(lane.sink)}", self._run(lane))
        except Exception as exc:  # a notification must never fail the caller
            self._metrics.faults.labels(FAULT).inc()
            log.warning("could not queue notification", error=repr(exc))

    async def flush(self) -> None:
        """Wait until every queued event was delivered or given up (tests)."""
        while tasks := self._tasks():
            await asyncio.wait(tasks)

    async def close(self, timeout_seconds: float = 2.0) -> None:
        """Give queued events up to `timeout_seconds`, then stop; the HTTP session is closed."""
        if self._tasks():
            try:
                await asyncio.wait_for(self.flush(), timeout_seconds)
            except asyncio.TimeoutError:
                log.warning("notifications not sent before shutdown", left=self.pending + len(self._tasks()))
            tasks = self._tasks()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for lane in self._lanes:
            lane.task = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _run(self, lane: _Lane) -> None:
        while lane:
            await self._deliver(lane.sink, lane.take())

    async def _deliver(self, sink: NotificationSettings, event: Mapping[str, Any]) -> None:
        """POST `event` to `sink`, retrying 5xx and network errors; never raises (but cancellation)."""
        body = {"text": slack_text(event)} if sink.format == "slack" else dict(event)
        headers = {**sink.headers, IDEMPOTENCY_HEADER: f"{event.get('decision')}/{event.get('event')}"}
        why = "not attempted"
        for attempt in range(1, sink.max_attempts + 1):
            retry = False
            try:
                if self._http is None or self._http.closed:
                    self._http = aiohttp.ClientSession()
                async with self._http.post(str(sink.url), json=body, headers=headers,
                                           timeout=aiohttp.ClientTimeout(total=sink.timeout_seconds)) as resp:
                    if resp.status < 300:
                        self.delivered += 1
                        return
                    why, retry = f"answered {resp.status}", resp.status >= 500
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                why, retry = f"{type(exc).__name__}: {exc}", True
            except Exception as exc:  # a bad header value, a body that is not JSON ...: not worth a retry
                why = f"{type(exc).__name__}: {exc}"
            if not retry or attempt == sink.max_attempts:
                break
            await self._sleep(self._backoff * 2 ** (attempt - 1))
        self.given_up += 1
        self._metrics.faults.labels(FAULT).inc()
        if sink.url_file is not None and sink.url:
            why = why.replace(sink.url, _where(sink))  # an error may quote the secret URL
        log.warning("notification not delivered", url=_where(sink), notification=event.get("event"),
                    decision=event.get("decision"), attempts=attempt, error=why)
