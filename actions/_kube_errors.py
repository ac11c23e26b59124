"""Kubernetes API errors in the action taxonomy, shared by every action that writes to the API."""
from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from core.outcome import ActionError, PermanentError, TemporaryError


def api_error(exc: BaseException, what: str) -> ActionError:
    """A Kubernetes client error in the action taxonomy: 403/404/4xx permanent, 5xx/429/network temporary."""
    if isinstance(exc, ApiException):
        message = server_message(exc)
        if exc.status == 403:  # RBAC will not change by retrying: fail once, loudly
            return PermanentError(f"forbidden: cannot {what}: {message}")
        if exc.status == 404:
            return PermanentError(f"not found: {what}: {message}")
        if exc.status == 429 or exc.status >= 500:
            return TemporaryError(f"server error {exc.status} on {what}: {message}")
        return PermanentError(f"rejected ({exc.status}) {what}: {message}")
    return TemporaryError(f"cannot reach the Kubernetes API for {what}: {type(exc).__name__}: {exc}")


def server_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(getattr(exc, "reason", exc))


def is_precondition_failure(exc: Any) -> bool:
    """409, or the generic 422 of a failed JSON-patch `test` (a schema 422 names causes)."""
    if exc.status == 409:
        return True
    if exc.status != 422:
        return False
    try:
        details = (json.loads(exc.body or "{}") or {}).get("details") or {}
    except ValueError:
        return False
    return not details.get("causes")
