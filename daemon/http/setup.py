"""What the HTTP app is built with besides the daemon's operations: body limits, the access log's
level, and the daemon's metrics (every response is counted) and clock (answers show times)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from aiohttp import web

from daemon.common.metrics import Metrics


@dataclass(frozen=True)
class BodyLimits:
    """How large a request body may be and how long it may take to arrive."""

    max_bytes: int
    read_timeout_seconds: float


@dataclass(frozen=True)
class HttpSetup:
    """Fixed at start: the app's limits and instruments (not the daemon's state, which the app reads
    only through the `Daemon` operations)."""

    metrics: Metrics
    clock: Callable[[], float]
    webhook: BodyLimits
    api: BodyLimits
    max_concurrent_webhooks: int
    access_log: Literal["off", "debug", "info"]


SETUP: web.AppKey[HttpSetup] = web.AppKey("http_setup")
