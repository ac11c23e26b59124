"""The journal: dedup, decisions, and retention that keeps it bounded without losing what matters."""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from core.signal import Signal, SignalSource
from daemon.storage.journal import Journal, JournalError, JournalValueError


def _signal(key: str) -> Signal:
    return Signal(SignalSource.ALERT, "A", {"model": "m"}, datetime.now(timezone.utc), key)


def test_prune_drops_old_processed_history_and_keeps_pending_recent_and_pins(tmp_path: Path):
    """Old processed signals with their decisions and steps go; pending signals, recent rows and
    pins stay, and dedup still holds for what stays."""
    j = Journal(tmp_path / "j.db")
    (old_id, _), (recent_id, _), (pending_id, _) = j.record_signals(
        [_signal("old"), _signal("recent"), _signal("pending")])[0]
    for sid in (old_id, recent_id):
        d = j.record_decision(sid, "p", "ns/m", "succeeded", "", {}, executed=True)
        j.record_step(d, 0, "notify", "apply", "ok", "", {}, 0.1)
        j.mark_processed(sid)
    j.record_pin("ns/m", "m", 1)
    j.record_evaluation("p", 0, "series", False, "ok")
    long_ago = time.time() - 40 * 86400
    j._db.execute("UPDATE signals SET received_at=? WHERE id IN (?, ?)", (long_ago, old_id, pending_id))
    j._db.execute("UPDATE decisions SET at=? WHERE signal_id=?", (long_ago, old_id))
    j._db.execute("UPDATE evaluations SET at=?", (long_ago,))

    pruned = j.prune(time.time() - 30 * 86400)

    assert pruned == {"signals": 1, "decisions": 1, "steps": 1, "evaluations": 1}
    assert sorted(s["dedup_key"] for s in j.signals()) == ["pending", "recent"]
    assert [d.signal_id for d in j.decisions()] == [recent_id]
    assert j.pins()[0]["version"] == 1
    assert j.record_signals([_signal("recent")])[1] == 1  # still a duplicate
    j.close()


def test_unstorable_text_fails_alone_names_the_field_and_the_next_write_works(tmp_path: Path):
    """A lone surrogate (JSON "\\ud800") used to leave BEGIN IMMEDIATE open and fail every later
    write. Now it is refused before SQLite sees it, names the field, writes nothing of its batch,
    and the journal goes on."""
    j = Journal(tmp_path / "j.db")
    bad = Signal(SignalSource.ALERT, "Tail\ud800", {"model": "m"}, datetime.now(timezone.utc), "bad")
    with pytest.raises(JournalValueError, match=r"signal 1 name"):
        j.record_signals([_signal("first"), bad])
    assert j.signals() == [] and j.pending_count() == 0
    ((sid, _),), dup = j.record_signals([_signal("after")])
    assert dup == 0
    with pytest.raises(JournalValueError, match="reason"):
        j.record_decision(sid, "p", "ns/m", "succeeded", "why \udfff", {}, executed=True)
    j.record_decision(sid, "p", "ns/m", "succeeded", "fine", {}, executed=True)
    labels = Signal(SignalSource.ALERT, "A", {"model": "\ud800"}, datetime.now(timezone.utc), "escaped")
    assert len(j.record_signals([labels])[0]) == 1  # the payload is JSON with escapes: storable
    assert j.signals()[-1]["payload"]["labels"]["model"] == "\ud800"
    j.close()


def test_any_error_inside_a_transaction_rolls_it_back(tmp_path: Path):
    """Not only sqlite3 errors: whatever a transaction raises rolls it back (JournalError for an
    Exception, the exception itself for cancellation), and nothing of it is half-written."""
    j = Journal(tmp_path / "j.db")
    pins: list[tuple[str, str, object, float]] = [("ns/a", "a", 1, 1.0), ("ns/b", "b", "not a version", 1.0)]
    with pytest.raises(JournalError, match="ValueError"):
        j.merge_cluster_state(pins, [], since=0)  # type: ignore[arg-type]
    assert j.pins() == []

    def cancelled() -> None:
        j._db.execute("INSERT INTO pins(target, model, version, at) VALUES ('ns/c', 'c', 1, 1.0)")
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        j._tx(cancelled)
    assert j.pins() == [] and not j._db.in_transaction
    j.record_pin("ns/d", "d", 2)
    assert [p["target"] for p in j.pins()] == ["ns/d"]
    j.close()


def test_pending_signals_pages_in_id_order_and_mark_processed_many_counts(tmp_path: Path):
    j = Journal(tmp_path / "j.db")
    new, _ = j.record_signals([_signal(f"k{i}") for i in range(5)])
    ids = [i for i, _ in new]
    assert [s.id for s in j.pending_signals(limit=2)] == ids[:2]
    assert [s.id for s in j.pending_signals(limit=2, after_id=ids[1])] == ids[2:4]
    assert j.mark_processed_many([ids[0], ids[1], ids[1]]) == 2
    j.mark_processed(ids[0])  # already processed: counted once
    assert j.pending_count() == 3 == len(j.pending_signals())
    j.close()
    reopened = Journal(tmp_path / "j.db")
    assert reopened.pending_count() == 3  # counted again from the file
    reopened.close()
