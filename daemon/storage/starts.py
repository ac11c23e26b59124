"""The version_starts table: when each version of a target started serving, as a detector trigger
saw it (tail_excess's start test, detectors/tail_excess_start.py). A restart or a failover reads
them back, so a start test resumes from the same start and is never started a second time."""
from __future__ import annotations

import math
from typing import Mapping

from daemon.storage.backend import Backend
from daemon.storage.blocking import blocking
from daemon.storage.core import JournalCore, checked


class Starts:
    """The journal's version starts, per target and detector trigger (its fingerprint)."""

    def __init__(self, core: JournalCore) -> None:
        self._core = core

    @blocking
    def record(self, target: str, trigger: str, starts: Mapping[str, float]) -> int:
        """Journal versions' starts (version -> unix seconds); a start already journaled for that
        version is kept (the first seen wins: one start per version). How many were added.

        A mapping of scalars, not rows, as `of` returns: the table holds one start per version."""
        for version, at in starts.items():
            checked(target=target, trigger=trigger, version=version)
            if not math.isfinite(at):
                raise ValueError(f"start of version {version!r} is not a time: {at!r}")
        now = self._core.clock()

        def run(db: Backend) -> int:
            added = 0
            for version, at in starts.items():
                added += db.execute(
                    "INSERT INTO version_starts(target, trigger_key, version, started_at, at) VALUES (?,?,?,?,?)"
                    " ON CONFLICT(target, trigger_key, version) DO NOTHING",
                    (target, trigger, version, float(at), now)).rowcount
            return added

        return self._core.write(run)

    @blocking
    def of(self, target: str, trigger: str) -> Mapping[str, float]:
        """The journaled starts of one trigger on `target`: version -> unix seconds."""
        return {str(r["version"]): float(r["started_at"]) for r in self._core.read(
            "SELECT version, started_at FROM version_starts WHERE target=? AND trigger_key=?", (target, trigger))}
