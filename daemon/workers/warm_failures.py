"""Warm loads that failed, read back from the journal's effects (the door journals every write).

A warm load that fails (the previous version missing from the repository, Triton refusing it) leaves
the replica serving what it served; the door journals its intent (`replica`, `loads`) and its result
`failed`. The warm keeper reads these rows on every pass instead of keeping them in memory, so a
restart or a new leader neither forgets the failure (and reloads every pass: each try starts the
version's backend instances) nor holds it forever: a failure older than `RETRY_AFTER_SECONDS` is
tried once more (a repository fixed meanwhile gets its warm version), and a later load that succeeded
on the replica ends it.
"""
from __future__ import annotations

from typing import Iterable

from daemon.storage.effects import DONE, FAILED, INTENT
from daemon.storage.journal import Journal
from daemon.storage.records import EffectRow

RETRY_AFTER_SECONDS = 3600.0
"""A warm version whose load failed on a replica is tried there again after this long."""
LOAD = "triton.load"  # the effects kind of a Triton load


def failed_warm_loads(rows: Iterable[EffectRow], writer: str) -> dict[str, int]:
    """Replica -> the warm version whose last load there by `writer` failed, from effects rows
    (oldest first: a result row names its intent's id). Pure."""
    intents: dict[int, tuple[str, int]] = {}
    failed: dict[str, int] = {}
    for row in rows:
        if row.writer != writer:
            continue
        data = row.data or {}
        if row.status == INTENT:
            replica, loads = data.get("replica"), data.get("loads")
            if isinstance(replica, str) and isinstance(loads, int):
                intents[row.id] = (replica, loads)
            continue
        intent = data.get("intent")
        found = intents.get(intent) if isinstance(intent, int) else None
        if found is None:
            continue
        replica, loads = found
        if row.status == FAILED:
            failed[replica] = loads
        elif row.status == DONE:
            failed.pop(replica, None)
    return failed


async def journaled_failures(journal: Journal, target: str, writer: str) -> dict[str, int]:
    """The failed warm loads of `target` within `RETRY_AFTER_SECONDS` (journal time). Raises JournalError."""
    since = journal.clock() - RETRY_AFTER_SECONDS
    return failed_warm_loads(await journal.effects.of.in_thread(target, LOAD, since), writer)
