"""The journal: dedup, decisions, and retention that keeps it bounded without losing what matters."""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from core.signal import Signal, SignalSource
from daemon.storage.backend import Backend
from daemon.storage.errors import JournalError, JournalValueError
from daemon.storage.journal import Journal
from daemon.storage.records import Pin, StepRecord
from daemon.storage.step_kinds import StepPhase, StepStatus
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
        j.decisions.record_step(StepRecord(d, 0, "notify", StepPhase.APPLY, StepStatus.OK, "", {}, 0.1))
        j.signals.mark_processed([sid])
    j.pins.record("ns/m", "m", 1)
    j.evaluations.record("p", 0, "series", False, "ok")
    long_ago = time.time() - 40 * 86400
    j.write(lambda db: db.execute("UPDATE signals SET received_at=? WHERE id IN (?, ?)", (long_ago, old_id, pending_id)))
    j.write(lambda db: db.execute("UPDATE decisions SET at=? WHERE signal_id=?", (long_ago, old_id)))
    j.write(lambda db: db.execute("UPDATE evaluations SET at=?", (long_ago,)))

    pruned = j.prune(time.time() - 30 * 86400)

    assert pruned == {"signals": 1, "decisions": 1, "steps": 1, "evaluations": 1}
    assert sorted(s.dedup_key for s in j.signals.all()) == ["pending", "recent"]
    assert [d.signal_id for d in j.decisions.all()] == [recent_id]
    assert j.pins.live()[0].version == 1
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
    assert j.signals.all()[-1].payload["labels"]["model"] == "\ud800"
    j.close()


def test_any_error_inside_a_transaction_rolls_it_back(open_journal: OpenJournal):
    """Not only sqlite3 errors: whatever a transaction raises rolls it back (JournalError for an
    Exception, the exception itself for cancellation), and nothing of it is half-written."""
    j = open_journal()
    pins = [Pin("ns/a", "a", 1, 1.0), Pin("ns/b", "b", "not a version", 1.0)]  # type: ignore[arg-type]
    with pytest.raises(JournalError, match="ValueError"):
        j.cluster.merge(pins, [], since=0)
    assert j.pins.live() == []

    def cancelled(db: Backend) -> None:
        db.execute("INSERT INTO pins(target, model, version, at) VALUES ('ns/c', 'c', 1, 1.0)")
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        j.write(cancelled)
    assert j.pins.live() == [] and not j._db.in_transaction
    j.pins.record("ns/d", "d", 2)
    assert [p.target for p in j.pins.live()] == ["ns/d"]
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
    assert (pin.target, pin.version, pin.from_version, pin.policy, pin.reason) == ("ns/m", 1, None, None, "")
    j.close()
    j = Journal(path)  # the migration runs again and changes nothing
    try:
        assert [p.version for p in j.pins.live()] == [1]
        j.pins.record("ns/m", "m", 1, from_version=2, reason="tail latency", policy="p")
        assert j.bad_versions.known("ns/m") == frozenset({2})
        ended = j.pins.end("ns/m", "operator said so")
        assert ended is not None and ended.from_version == 2
        assert j.pins.live() == []
        (hist,) = j.pins.ended("ns/m")
        assert hist.ended_reason == "operator said so" and hist.policy == "p"
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
        assert (pin.decision_id, pin.signal, pin.from_version) == (d, "A", 2)
        (mark,) = j.bad_versions.of("ns/m")
        assert mark.version == 2 and f"decision {d}" in mark.reason and mark.decision_id == d
        j.pins.clear("ns/m", "reverted")
        assert j.pins.live() == [] and j.bad_versions.known("ns/m") == frozenset()
        assert j.pins.ended()[0].ended_reason == "reverted"
        j.bad_versions.mark("ns/m", 5, "by hand")
        assert j.bad_versions.clear("ns/m", 5, "fixed") == 1 and j.bad_versions.clear("ns/m", 5, "fixed") == 0
        cleared = [m for m in j.bad_versions.of("ns/m", include_cleared=True) if m.version == 5]
        assert cleared[0].cleared_reason == "fixed"
    finally:
        j.close()


def test_prune_to_size_drops_the_oldest_settled_history_and_keeps_what_must_stay(open_journal: OpenJournal):
    """Past the size bound the oldest settled decisions (with their steps) and processed signals go
    first; never a pending signal, a decision executing, awaiting approval or with its recovery
    unsettled, an executed plan the guards still count, a live pin, a freeze or a bad mark."""
    j = open_journal()
    now = time.time()
    old = now - 10 * 86400  # older than the guards count, younger than retentionDays
    keys = [f"k{i}" for i in range(14)] + ["pending"]
    ids = [sid for sid, _ in j.signals.record([_signal(k) for k in keys])[0]]
    settled = []
    for i in range(8):  # settled, old: blocked floods and old executed plans
        d = j.decisions.record(ids[i], "p", "ns/m", "blocked" if i % 2 else "succeeded", "", {},
                               executed=i % 2 == 0)
        j.decisions.record_step(StepRecord(d, 0, "notify", StepPhase.APPLY, StepStatus.OK, "", {}, 0.1))
        settled.append(d)
    executing = j.decisions.record(ids[8], "p", "ns/m", "executing", "", {}, executed=True)
    awaiting = j.approvals.request(ids[9], "p", "ns/m", {"steps": []}, deadline=now + 3600).decision_id
    watching = j.decisions.record(ids[10], "p", "ns/m", "succeeded", "", {}, executed=True)
    j.decisions.record_step(StepRecord(watching, -1, "verify", StepPhase.RECOVERY, StepStatus.PENDING, "checking", {}))
    reverting = j.decisions.record(ids[11], "p", "ns/m", "succeeded", "", {}, executed=True)
    j.decisions.record_step(StepRecord(reverting, -1, "verify", StepPhase.RECOVERY, StepStatus.PENDING, "checking", {}))
    j.decisions.record_verdict(reverting, StepStatus.NOT_RECOVERED, "did not hold", {"follow_up": "revert"})
    guarded = j.decisions.record(ids[12], "p", "ns/m2", "succeeded", "", {}, executed=True)  # recent
    j.signals.mark_processed(ids[:14])
    j.write(lambda db: db.execute("UPDATE signals SET received_at=? WHERE dedup_key != 'pending' AND dedup_key != 'k12'"
                                  " AND dedup_key != 'k13'", (old,)))
    j.write(lambda db: db.execute("UPDATE signals SET received_at=? WHERE dedup_key = 'pending'", (old - 1,)))
    j.write(lambda db: db.execute("UPDATE decisions SET at=? WHERE id != ?", (old, guarded)))
    j.pins.record("ns/m", "m", 1)
    j.freezes.record("ns/m", "escalated", now + 3600)
    j.bad_versions.mark("ns/m", 2, "rolled back")

    pruned = j.prune_to_size(3, keep_after=now - 86400)

    kept = {d.id for d in j.decisions.all()}
    assert kept == {executing, awaiting, watching, reverting, guarded}  # 5 > 3: all that cannot go stay
    assert pruned["decisions"] == 8 and pruned["steps"] == 8
    signals = {s.dedup_key for s in j.signals.all()}
    assert "pending" in signals and {"k8", "k9", "k10", "k11", "k12"} <= signals  # pending; a kept decision's
    assert "k13" in signals  # processed but recent: common cause counts it
    assert not signals & {f"k{i}" for i in range(8)}
    assert [p.version for p in j.pins.live()] == [1]
    assert j.freezes.active_on("ns/m") is not None and j.bad_versions.known("ns/m") == frozenset({2})
    nothing = {"decisions": 0, "steps": 0, "signals": 0, "effects": 0}
    assert j.prune_to_size(3, keep_after=now - 86400) == nothing
    assert j.prune_to_size(100, keep_after=now) == nothing  # under the bound
    with pytest.raises(ValueError):
        j.prune_to_size(0, keep_after=now)


def test_prune_to_size_bounds_the_doors_effects_and_keeps_what_the_pins_and_writes_need(
        open_journal: OpenJournal):
    """Past the size bound the oldest effects go first (an intent before its result); never one newer
    than the guards' horizon (a write that may be in flight, its intent included), an escalated tug
    of war, or a re-pin of a live pin (the tug of war counts them); a re-pin of an ended pin may go."""
    j = open_journal()
    now = time.time()
    old = now - 10 * 86400
    for i in range(6):  # settled writes, old: an intent and its result each
        intent = j.effects.record("executor", "ns/m", "triton.load", "intent", f"load {i}", {})
        j.effects.record("executor", "ns/m", "triton.load", "done", f"load {i}", {"intent": intent})
    j.effects.record("pins", "ns/m", "pin.escalated", "done", "escalated", {"version": 2})
    j.effects.record("pins", "ns/m", "pin.repin", "done", "re-pinned", {"version": 2})  # live pin below
    j.effects.record("pins", "ns/gone", "pin.repin", "done", "re-pinned", {"version": 2})  # its pin ended
    j.write(lambda db: db.execute("UPDATE effects SET at=?", (old,)))
    in_flight = j.effects.record("executor", "ns/m", "triton.load", "intent", "load now", {})  # no result yet
    j.pins.record("ns/m", "m", 1)

    pruned = j.prune_to_size(3, keep_after=now - 86400)

    assert pruned["effects"] == 13  # 16 rows past 3: every prunable one
    kept = [(r.kind, r.status, r.target) for r in j.effects.of()]
    assert kept == [("pin.escalated", "done", "ns/m"), ("pin.repin", "done", "ns/m"), ("triton.load", "intent", "ns/m")]
    assert j.effects.of()[-1].id == in_flight

    j.write(lambda db: db.execute("DELETE FROM effects"))
    for i in range(5):
        intent = j.effects.record("executor", "ns/m", "triton.load", "intent", f"load {i}", {})
        j.effects.record("executor", "ns/m", "triton.load", "done", f"load {i}", {"intent": intent})
    j.write(lambda db: db.execute("UPDATE effects SET at=?", (old,)))
    assert j.prune_to_size(4, keep_after=now - 86400)["effects"] == 6  # the oldest first: whole pairs here
    rows = j.effects.of()
    assert [r.message for r in rows] == ["load 3"] * 2 + ["load 4"] * 2
    assert [r.data.get("intent") for r in rows] == [None, rows[0].id, None, rows[2].id]


async def test_the_pruner_bounds_the_journal_in_size_each_round(tmp_path: Path):
    """The journal-prune loop's round prunes by age, then by size past journal.maxHistoryRows, with
    the guards' horizon the service hands it; a journal under the bound loses nothing."""
    from daemon.common.config import JournalSettings
    from daemon.common.metrics import Metrics
    from daemon.workers.journal_upkeep import JournalPruner

    j = Journal(tmp_path / "j.db")
    ids = [sid for sid, _ in j.signals.record([_signal(f"k{i}") for i in range(1500)])[0]]
    for sid in ids:
        j.decisions.record(sid, "p", "ns/m", "blocked", "flood", {}, executed=False)
    j.signals.mark_processed(ids)
    j.write(lambda db: db.execute("UPDATE signals SET received_at = received_at - 7200"))
    settings = JournalSettings.model_validate({"maxHistoryRows": 1000})
    pruner = JournalPruner(j, Metrics(), settings, time.time, guarded_seconds=lambda: 3600.0)

    pruned = await pruner.prune_once()

    assert pruned["decisions"] == 500 and pruned["signals"] == 500
    assert len(j.decisions.all()) == 1000 and len(j.signals.all()) == 1000
    assert (await pruner.prune_once()).get("decisions", 0) == 0
    j.close()
