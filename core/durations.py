"""Durations as operators write them (`30s`, `5m`, `1h30m`, `7d`) and as Istio wants them."""
from __future__ import annotations

import re

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str | int | float) -> float:
    """Seconds in a duration like ``90s``, ``5m``, ``1h30m`` or a bare number of seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"duration must not be negative: {text}")
        return float(text)
    if not isinstance(text, str):
        raise ValueError(f"duration must be a string like '30s' or a number, got {text!r}")
    raw = text.strip()
    if not raw:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(raw):
        raise ValueError(f"invalid duration {text!r}: use e.g. 500ms, 30s, 5m, 1h30m, 7d")
    return total


def format_ms_duration(milliseconds: float) -> str:
    """Istio / Gateway API / PromQL duration text for whole milliseconds, e.g. ``2500ms`` or ``3s``."""
    ms = int(round(milliseconds))
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"
