"""When each series refits (Prophet): a fixed slot per series inside the refit interval, so many
series spread their fits evenly instead of all refitting in one cycle."""
from __future__ import annotations

import hashlib
import math


def refit_phase_seconds(key: str, interval_seconds: float) -> float:
    """Where in each refit interval this series refits: a stable hash of its key, so 1,000
    series spread evenly over the interval instead of all refitting in the same cycle."""
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return (h / 2.0**64) * interval_seconds


def next_refit_time(last_attempt: float, phase: float, interval_seconds: float) -> float:
    """The first slot ``phase + k * interval`` strictly after ``last_attempt``."""
    k = math.floor((last_attempt - phase) / interval_seconds) + 1
    return phase + k * interval_seconds


def refit_due(last_attempt: float | None, phase: float, interval_seconds: float, now: float) -> bool:
    """Never fitted, or this series' slot has come round since its last attempt."""
    return last_attempt is None or now >= next_refit_time(last_attempt, phase, interval_seconds)
