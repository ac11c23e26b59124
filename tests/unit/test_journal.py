"""The journal: dedup, decisions, and retention that keeps it bounded without losing what matters."""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from core.signal import Signal, SignalSource
from daemon.storage.errors import JournalError, JournalValueError
from daemon.storage.journal import Journal
from tests.support.journal_backends import OpenJournal


def _signal(key: str) -> Signal:
    return Signal(SignalSource.ALERT, "A", {"model": "m"}, datetime.now(timezone.utc), key)


def test_prune_drops_old_processed_history_and_keeps_pending_recent_and_pins(open_journal: OpenJournal):
    """Old processed signals with their decisions and steps go; pending signals, recent rows and
    pins stay, and dedup still holds for what stays."""
    j = open_journal()
    (old_id, _), (recent_id, _), (pending_id, _) = j.signals.record(
        [_signal("old"), _signal("recent"), _signal("pending")])[0]
    for sid in (old_id, recent_id):
        d = j.decisions.record(sid, "p", "ns/m", "succeeded", "", {}, executed=True)
        j.decisions.record_step(d, 0, "notify", "apply", "ok", "", {}, 0.1)
        j.signals.mark_processed([sid])
    j.pins.record("ns/m", "m", 1)
    j.evaluations.record("p", 0, "series", False, "ok")
    long_ago = time.time() - 40 * 86400
    j._db.execute("UPDATE signals SET received_at=? WHERE id IN (?, ?)", (long_ago, old_id, pending_id))
    j._db.execute("UPDATE decisions SET at=? WHERE signal_id=?", (long_ago, old_id))
    j._db.execute("UPDATE evaluations SET at=?", (long_ago,))

    pruned = j.prune(time.time() - 30 * 86400)

    assert pruned == {"signals": 1, "decisions": 1, "steps": 1, "evaluations": 1}
    assert sorted(s["dedup_key"] for s in j.signals.all()) == ["pending", "recent"]
    assert [d.signal_id for d in j.decisions.all()] == [recent_id]
    assert j.pins.live()[0]["version"] == 1
    assert j.signals.record([_signal("recent")])[1] == 1  # still a duplicate
    j.close()


def test_unstorable_text_fails_alone_names_the_field_and_the_next_write_works(open_journal: OpenJournal):
    """A lone surrogate (JSON "\\ud800") used to leave BEGIN IMMEDIATE open and fail every later
    write. Now it is refused before SQLite sees it, names the field, writes nothing of its batch,
    and the journal goes on."""
    j = open_journal()
    bad = Signal(SignalSource.ALERT, "Tail\ud800", {"model": "m"}, datetime.now(timezone.utc), "bad")
    with pytest.raises(JournalValueError, match=r"signal 1 name"):
        j.signals.record([_signal("first"), bad])
    assert j.signals.all() == [] and j.signals.pending_count() == 0
    ((sid, _),), dup = j.signals.record([_signal("after")])
    assert dup == 0
    with pytest.raises(JournalValueError, match="reason"):
        j.decisions.record(sid, "p", "ns/m", "succeeded", "why \udfff", {}, executed=True)
    j.decisions.record(sid, "p", "ns/m", "succeeded", "fine", {}, executed=True)
    labels = Signal(SignalSource.ALERT, "A", {"model": "\ud800"}, datetime.now(timezone.utc), "escaped")
    assert len(j.signals.record([labels])[0]) == 1  # the payload is JSON with escapes: storable
    assert j.signals.all()[-1]["payload"]["labels"]["model"] == "\ud800"
    j.close()


def test_any_error_inside_a_transaction_rolls_it_back(open_journal: OpenJournal):
    """Not only sqlite3 errors: whatever a transaction raises rolls it back (JournalError for an
    Exception, the exception itself for cancellation), and nothing of it is half-written."""
    j = open_journal()
    pins: list[tuple[str, str, object, float]] = [("ns/a", "a", 1, 1.0), ("ns/b", "b", "not a version", 1.0)]
    with pytest.raises(JournalError, match="ValueError"):
        j.cluster.merge(pins, [], since=0)  # type: ignore[arg-type]
    assert j.pins.live() == []

    def cancelled() -> None:
        j._db.execute("INSERT INTO pins(target, model, version, at) VALUES ('ns/c', 'c', 1, 1.0)")
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        j._tx(cancelled)
    assert j.pins.live() == [] and not j._db.in_transaction
    j.pins.record("ns/d", "d", 2)
    assert [p["target"] for p in j.pins.live()] == ["ns/d"]
    j.close()


def test_pending_signals_pages_in_id_order_and_mark_processed_many_counts(open_journal: OpenJournal):
    j = open_journal()
    new, _ = j.signals.record([_signal(f"k{i}") for i in range(5)])
    ids = [i for i, _ in new]
    assert [s.id for s in j.signals.pending(limit=2)] == ids[:2]
    assert [s.id for s in j.signals.pending(limit=2, after_id=ids[1])] == ids[2:4]
    assert j.signals.mark_processed([ids[0], ids[1], ids[1]]) == 2
    j.signals.mark_processed([ids[0]])  # already processed: counted once
    assert j.signals.pending_count() == 3 == len(j.signals.pending())
    j.close()
    reopened = open_journal()
    assert reopened.signals.pending_count() == 3  # counted again from the file
    reopened.close()


def test_old_schema_journal_opens_migrated_and_keeps_its_pins(tmp_path: Path):
    """A journal file from before pin life cycles (pins without why, no history, no bad versions)
    opens: the columns and tables are added, its pins stay live and can end; opening twice is fine."""
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE pins (target TEXT PRIMARY KEY, model TEXT NOT NULL, version INTEGER NOT NULL, at REAL NOT NULL);
        INSERT INTO pins VALUES ('ns/m', 'm', 1, 1000.0);
    """)
    db.commit()
    db.close()
    j = Journal(path)
    (pin,) = j.pins.live()
    assert (pin["target"], pin["version"], pin["from_version"], pin["policy"], pin["reason"]) == ("ns/m", 1, None, None, "")
    j.close()
    j = Journal(path)  # the migration runs again and changes nothing
    try:
        assert [p["version"] for p in j.pins.live()] == [1]
        j.pins.record("ns/m", "m", 1, from_version=2, reason="tail latency", policy="p")
        assert j.bad_versions.known("ns/m") == frozenset({2})
        ended = j.pins.end("ns/m", "operator said so")
        assert ended is not None and ended["from_version"] == 2
        assert j.pins.live() == []
        (hist,) = j.pins.ended("ns/m")
        assert hist["ended_reason"] == "operator said so" and hist["policy"] == "p"
    finally:
        j.close()


def test_pin_records_why_and_marks_the_version_rolled_back_from_bad(open_journal: OpenJournal):
    """record_pin keeps the decision, its signal and reason; from_version is marked bad once;
    a revert (clear_pin) ends the pin and clears its decision's marks; clear_bad is journaled."""
    j = open_journal()
    try:
        ((sid, _),), _ = j.signals.record([_signal("k")])
        d = j.decisions.record(sid, "p", "ns/m", "executing", "", {}, executed=True)
        j.pins.record("ns/m", "m", 1, from_version=2, decision_id=d, reason="pin m to version 1", policy="p")
        j.pins.record("ns/m", "m", 1, from_version=2, decision_id=d, reason="again", policy="p")
        (pin,) = j.pins.live()
        assert (pin["decision_id"], pin["signal"], pin["from_version"]) == (d, "A", 2)
        (mark,) = j.bad_versions.of("ns/m")
        assert mark["version"] == 2 and f"decision {d}" in mark["reason"] and mark["decision_id"] == d
        j.pins.clear("ns/m", "reverted")
        assert j.pins.live() == [] and j.bad_versions.known("ns/m") == frozenset()
        assert j.pins.ended()[0]["ended_reason"] == "reverted"
        j.bad_versions.mark("ns/m", 5, "by hand")
        assert j.bad_versions.clear("ns/m", 5, "fixed") == 1 and j.bad_versions.clear("ns/m", 5, "fixed") == 0
        cleared = [m for m in j.bad_versions.of("ns/m", include_cleared=True) if m["version"] == 5]
        assert cleared[0]["cleared_reason"] == "fixed"
    finally:
        j.close()
