"""Timeout sink `http`: a custom gateway's admin endpoint. GET -> {"timeoutMs": N}; PUT the same.

Optimistic when the gateway sends an ETag: the PUT carries If-Match and a 412 is a conflict.
Without an ETag the value is compared right before the write (the best such an API allows).

Delivery: at-least-once, with `Idempotency-Key: <effect key>` on the PUT. A decision resumed after
a crash between the PUT and its journal record GETs the value first and does not PUT again when it
already reads as planned; but the endpoint holds no mark of who wrote it and may apply a PUT
later than it answers, so a repeated PUT (same key) is possible and the gateway should drop it.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import aiohttp
from pydantic import Field

from actions._compare_and_swap import Conflict
from actions.base import IDEMPOTENCY_HEADER, Effect
from actions.timeout_sinks.base import SinkParams, TimeoutReading
from core.outcome import ActionError, PermanentError, TemporaryError

if TYPE_CHECKING:
    from actions.base import ActionDeps


class HttpSinkParams(SinkParams):
    kind: Literal["http"]
    url: str = Field(pattern=r"^https?://[^\s]+$")
    headers: dict[str, str] = Field(default_factory=dict)
    request_timeout_seconds: float = Field(10.0, gt=0, le=120, alias="requestTimeoutSeconds")


class HttpEndpointSink:
    kind: ClassVar[str] = "http"
    Params: ClassVar[type[SinkParams]] = HttpSinkParams

    def __init__(self, params: HttpSinkParams, deps: "ActionDeps") -> None:
        self.params = params
        self._deps = deps

    def encode(self, ms: int) -> int:
        return int(ms)

    def to_ms(self, raw: Any) -> float | None:
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise PermanentError(f"{self.params.url}: timeoutMs is {raw!r}, not a number")
        return float(raw)

    async def _request(self, method: str, headers: dict[str, str], body: Any = None) -> tuple[int, Any, str | None]:
        timeout = aiohttp.ClientTimeout(total=self.params.request_timeout_seconds)
        session = self._deps.http
        own = session is None
        if own:
            session = aiohttp.ClientSession()
        assert session is not None
        try:
            async with session.request(method, self.params.url, json=body, timeout=timeout,
                                       headers={**self.params.headers, **headers}) as resp:
                payload = await resp.json(content_type=None) if resp.status == 200 else await resp.text()
                return resp.status, payload, resp.headers.get("ETag")
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise TemporaryError(f"{method} {self.params.url}: {type(exc).__name__}: {exc}") from exc
        finally:
            if own:
                await session.close()

    def _error(self, method: str, status: int, payload: Any) -> ActionError:
        text = f"{method} {self.params.url} answered {status}: {str(payload)[:200]}"
        return TemporaryError(text) if status >= 500 or status == 429 else PermanentError(text)

    async def read(self) -> TimeoutReading:
        status, payload, etag = await self._request("GET", {})
        if status != 200:
            raise self._error("GET", status, payload)
        if not isinstance(payload, dict) or "timeoutMs" not in payload:
            raise PermanentError(f"GET {self.params.url}: expected {{\"timeoutMs\": N}}, got {str(payload)[:200]}")
        raw = payload["timeoutMs"]
        return TimeoutReading(raw, self.to_ms(raw), etag, f"gateway endpoint {self.params.url}")

    async def write(self, raw: Any, expected: TimeoutReading, effect_key: str | None = None) -> TimeoutReading:
        headers = {} if effect_key is None else {IDEMPOTENCY_HEADER: effect_key}
        if expected.version is not None:
            headers["If-Match"] = expected.version
        else:
            fresh = await self.read()
            if fresh.raw != expected.raw:
                raise Conflict(f"timeoutMs changed from {expected.raw} to {fresh.raw}")
        effect = Effect("sink.write", f"PUT {self.params.url} timeoutMs={raw}",
                        timeout_seconds=self.params.request_timeout_seconds, data={"timeoutMs": raw})
        status, payload, etag = await self._deps.actuator.write(
            effect, lambda: self._request("PUT", headers, {"timeoutMs": raw}))
        if status == 412:
            raise Conflict(f"PUT {self.params.url}: precondition failed (ETag {expected.version})")
        if status not in (200, 204):
            raise self._error("PUT", status, payload)
        return TimeoutReading(raw, self.to_ms(raw), etag, expected.where)
