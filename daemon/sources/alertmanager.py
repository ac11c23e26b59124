"""Alertmanager API v2 client: the silences, as the JSON list `GET /api/v2/silences` answers.

One HTTP session for the daemon's lifetime; every call is bounded by `timeout_seconds`, so a down or
slow Alertmanager costs at most that long. Parsing and matching live with their caller
(`daemon.workers.silences`), which decides what a failure means.
"""
from __future__ import annotations

import asyncio
from typing import Any

import aiohttp


class AlertmanagerError(Exception):
    """The silences could not be read (network, timeout, a non-2xx answer, not JSON)."""


class AlertmanagerClient:
    def __init__(self, url: str, timeout_seconds: float = 2.0) -> None:
        self.url = url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    async def silences(self) -> Any:
        """The JSON answer of `GET /api/v2/silences` (all states; the caller filters).

        Raises:
            AlertmanagerError: no answer within the timeout, a non-2xx status, or a body that is not JSON.
        """
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.get(f"{self.url}/api/v2/silences") as resp:
                if resp.status // 100 != 2:
                    raise AlertmanagerError(f"GET /api/v2/silences answered {resp.status}")
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:  # all mean: not checked
            raise AlertmanagerError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
