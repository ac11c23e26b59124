"""Which episode (the dedup key) a predicted breach belongs to."""
from __future__ import annotations


class Episodes:
    """Episode starts per series key, stable across cycles so re-detections dedup. A forecast
    that flickers off for up to ``gap_seconds`` (one horizon) is the same incident, not a new one."""

    def __init__(self, gap_seconds: float) -> None:
        self._gap = gap_seconds
        self._open: dict[str, tuple[float, float]] = {}  # key -> (start, last active)

    def touch(self, key: str, now: float) -> float:
        """The episode's start; a new one unless the last was active within the gap."""
        ep = self._open.get(key)
        start = now if ep is None or now - ep[1] > self._gap else ep[0]
        self._open[key] = (start, now)
        return start

    def close(self, key: str, now: float) -> None:
        """Forget an episode inactive for longer than the gap (a shorter lull keeps it)."""
        ep = self._open.get(key)
        if ep is not None and now - ep[1] > self._gap:
            del self._open[key]
