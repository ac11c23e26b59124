"""A journal written by tailguard 546b308 (the release before the journal became repositories)
opens with this code, reads back as that release read it, and takes new writes.

data/journal_546b308.sql is that release's SQLite journal, dumped with sqlite3's iterdump (schema
as its migrations left it, every table with rows); data/journal_546b308.reads.json is what that
release's reads returned on it."""
from __future__ import annotations

import dataclasses
import json
import sqlite3
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from core.signal import Signal, SignalSource
from daemon.storage.journal import Journal
from daemon.storage.records import SharedState

DATA = Path(__file__).parent / "data"
NOW = 1_900_000_000.0  # the reads' time in the old release (its far-future freezes still in force)


def _plain(v: object) -> object:
    """A read as JSON has it: dataclasses as objects, enums as values, sets sorted."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, frozenset, set)):
        return [_plain(x) for x in (sorted(v) if isinstance(v, (frozenset, set)) else v)]
    return v


@pytest.fixture
def old_journal(tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    conn = sqlite3.connect(path)
    conn.executescript((DATA / "journal_546b308.sql").read_text())
    conn.close()
    return path


def _reads(j: Journal) -> dict[str, Any]:
    decisions = j.decisions.all()
    return {
        "signals": j.signals.all(),
        "pending_signals": j.signals.pending(),
        "signals_since": j.signals.since(0),
        "signal": j.signals.get(3),
        "pending_count": j.signals.pending_count(),
        "decisions": decisions,
        "decision": j.decisions.get(1),
        "decision_for": j.decisions.for_signal(2, "ranker-forecast"),
        "steps": {d.id: j.decisions.steps(d.id) for d in decisions},
        "open_recoveries": j.decisions.open_recoveries(),
        "latest_decisions": j.decisions.latest(),
        "guard_history": j.decisions.guard_history("ranker-tail", "prod/ranker", 10 * 365 * 86400, now=NOW),
        "executed_marks": j.decisions.executed_marks(0),
        "freezes": j.freezes.all(),
        "active_freezes": j.freezes.active(now=NOW),
        "active_freeze": j.freezes.active_on("prod/other", now=NOW),
        "approvals": j.approvals.all(),
        "approval": j.approvals.get(1),
        "pending_approval": j.approvals.pending_for("other-tail", "prod/other"),
        "evaluations": j.evaluations.all(),
        "pins": j.pins.live(),
        "ended_pins": j.pins.ended(),
        "bad_versions": j.bad_versions.of("prod/ranker", include_cleared=True),
        "known_bad": j.bad_versions.known("prod/ranker"),
        "current_term": j.terms.current(),
        "shared_state": _positional(j.cluster.shared_state(0, now=NOW)),
    }


def _positional(shared: SharedState) -> dict[str, list[tuple[object, ...]]]:
    """SharedState as the old release returned it: positional tuples, in its field orders."""
    return {"pin_ends": [(e.target, e.at, e.ended_at, e.reason) for e in shared.pin_ends],
            "bad_marks": [(m.target, m.version, m.reason, m.at) for m in shared.bad_marks],
            "bad_clears": [(c.target, c.version, c.at, c.reason) for c in shared.bad_clears],
            "freezes": [(f.target, f.reason, f.at, f.until) for f in shared.freezes],
            "lifts": [(lift.target, lift.at, lift.reason, lift.until) for lift in shared.lifts]}


def test_an_old_journal_reads_back_as_the_old_release_read_it(old_journal: Path):
    expected = json.loads((DATA / "journal_546b308.reads.json").read_text())
    j = Journal(old_journal)
    try:
        got = json.loads(json.dumps(_plain(_reads(j))))
    finally:
        j.close()
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == expected[name], name


def test_an_old_journal_takes_new_writes(old_journal: Path):
    """Dedup holds for its signals, ids follow its rows, its term is taken over, its pin ends."""
    j = Journal(old_journal)
    try:
        at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
        new, duplicates = j.signals.record([Signal(SignalSource.ALERT, "TailLatency", {"model": "ranker"}, at, "k1"),
                                            Signal(SignalSource.ALERT, "TailLatency", {"model": "ranker"}, at, "k6")])
        assert duplicates == 1 and [sid for sid, _ in new] == [6]
        assert j.terms.take("replica-b").term == 2
        decision = j.decisions.record(6, "ranker-tail", "prod/ranker", "noop", "nothing to do", {}, False)
        claim = j.read("SELECT holder, term FROM decisions WHERE id=?", (decision,))[0]
        assert (claim["holder"], claim["term"]) == ("replica-b", 2)
        j.signals.mark_processed([6])
        assert j.signals.pending_count() == 3  # 3, 4 and 5 were pending in the old journal
        ended = j.pins.end("prod/ranker", "rolled forward")
        assert ended is not None and ended.version == 2
        assert [p.target for p in j.pins.live()] == ["prod/imported"]
    finally:
        j.close()
    assert sqlite3.connect(old_journal).execute("SELECT MAX(version) FROM schema_migrations").fetchone() == (5,)
