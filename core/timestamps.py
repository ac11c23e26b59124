"""Unix seconds as the journal, the API and the notifications write them: ISO 8601 in UTC, to the second."""
from __future__ import annotations

from datetime import datetime, timezone


def iso_utc(unix: float) -> str:
    """`unix` as e.g. 2026-12-01T21:29:31+00:00."""
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="seconds")
