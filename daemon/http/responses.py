"""Answers shared by the webhook and the operator API: a one-line JSON error, and answering before
an unread body without aiohttp lingering on it."""
from __future__ import annotations

from typing import Any

from aiohttp import web

_REASON_CHARS = 300


def one_line(reason: str, limit: int = _REASON_CHARS) -> str:
    flat = " ".join(reason.split())  # one line, whatever the reason quotes
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def error(status: int, reason: str, extra: dict[str, Any] | None = None, /, **headers: str) -> web.Response:
    """`{"error": <one line>}` (plus `extra` fields) with `status`."""
    return web.json_response({"error": one_line(reason), **(extra or {})}, status=status, headers=headers or None)


async def answer_and_close(request: web.Request, response: web.Response) -> web.Response:
    """Send `response` now and close the connection when the body was not read to its end (stalled,
    undecodable, or refused before reading): aiohttp would otherwise linger up to 10 s reading the
    rest, and re-raise a broken body's error into its log."""
    if request.content.is_eof():
        return response
    response.force_close()
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        pass  # the sender is gone; nothing to tell it
    request.protocol.force_close()
    return response
