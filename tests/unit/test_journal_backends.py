"""The two journal backends: the same schema, versioned migrations, and the SQL that differs per
database (id lists, JSON fields, upserts, RETURNING) giving the same answers on both."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from core.decision import DecisionState
from core.signal import Signal, SignalSource
from daemon.storage import postgres_backend, sqlite_backend
from daemon.storage.errors import JournalError, JournalValueError
from daemon.storage.journal import Journal
from daemon.storage.records import (DAEMON_SCOPE, FOREVER, BadMark, CheckInFlight, ExecutedMark, FreezeRequest,
                                    MergeCounts, Pin, SharedState, Verdict)
from tests.support.journal_backends import OpenJournal


def _signal(key: str, name: str = "A") -> Signal:
    return Signal(SignalSource.ALERT, name, {"model": "m"}, datetime.now(timezone.utc), key)


def _columns(journal: Journal) -> dict[str, set[str]]:
    if journal.backend == "sqlite":
        tables = [r["name"] for r in journal.read("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: {r["name"] for r in journal.read(f"PRAGMA table_info({t})")} for t in tables}
    rows = journal.read("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema='public'")
    out: dict[str, set[str]] = {}
    for r in rows:
        out.setdefault(r["table_name"], set()).add(r["column_name"])
    return out


@pytest.mark.integration
def test_both_backends_have_the_same_tables_and_columns(tmp_path: Path, postgres_dsn: str):
    """A migration added to one backend and not the other shows here."""
    lite, pg = Journal(tmp_path / "j.db"), Journal(postgres_dsn)
    try:
        assert _columns(lite) == _columns(pg)
        assert {m.version for m in sqlite_backend.MIGRATIONS} == {m.version for m in postgres_backend.MIGRATIONS}
    finally:
        lite.close()
        pg.close()


@pytest.mark.integration
def test_postgres_migrates_an_empty_database_once(empty_postgres_dsn: str):
    j = Journal(empty_postgres_dsn)
    j.close()
    j = Journal(empty_postgres_dsn)  # nothing left to apply
    try:
        versions = [r["version"] for r in j.read("SELECT version FROM schema_migrations ORDER BY version")]
        assert versions == [m.version for m in postgres_backend.MIGRATIONS]
    finally:
        j.close()


def test_a_journal_from_a_newer_release_is_refused(journal_store: Path | str):
    j = Journal(journal_store)
    j.write(lambda db: db.execute("INSERT INTO schema_migrations(version, description, applied_at) VALUES (999, 'future', 0)"))
    j.close()
    with pytest.raises(JournalError, match="schema version 999 is newer"):
        Journal(journal_store)


@pytest.mark.slow
def test_an_unreachable_database_is_a_journal_error():
    """Refused at open (the daemon exits 1), and the pool's reconnecting workers stop with it."""
    with pytest.raises(JournalError, match="cannot open the journal"):
        Journal("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", busy_timeout_seconds=1)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("tailguard-journal")]


def test_text_the_database_cannot_store_fails_its_caller_alone(open_journal: OpenJournal):
    """NUL is storable text for SQLite; PostgreSQL refuses it, as a value error (webhook 422, no
    retry) and without spoiling the transaction for the next caller."""
    j = open_journal()
    nul = _signal("nul", name="A\x00B")
    if j.backend == "postgres":
        with pytest.raises(JournalValueError, match="NUL"):
            j.signals.record([nul])
        with pytest.raises(JournalValueError, match="NUL"):
            j.pins.record("ns/m", "m\x00", 1)
    else:
        assert len(j.signals.record([nul])[0]) == 1
    assert len(j.signals.record([_signal("after")])[0]) == 1


def test_decisions_approvals_and_recoveries(open_journal: OpenJournal):
    """Upsert keeps `executed` once set; approvals (RETURNING ids) approve and expire; an open
    recovery is found through the JSON field of its verdict."""
    j = open_journal()
    (s1, _), (s2, _), (s3, _) = j.signals.record([_signal("a"), _signal("b"), _signal("c")])[0]
    d1 = j.decisions.record(s1, "p", "ns/m", DecisionState.EXECUTING, "", {"steps": [1]}, executed=True)
    assert j.decisions.record(s1, "p", "ns/m", DecisionState.SUCCEEDED, "done", {}, executed=False) == d1
    decision = j.decisions.get(d1)
    assert decision is not None and decision.executed and decision.state == "succeeded"
    j.decisions.finish(d1, DecisionState.SUCCEEDED, "ok", recovery=CheckInFlight("watching", {"window": 60}))
    assert [r.decision.id for r in j.decisions.open_recoveries()] == [d1]
    j.decisions.record_verdict(d1, "not_recovered", "still slow", {"follow_up": "revert"})
    (open_,) = j.decisions.open_recoveries()
    assert open_.row.status == "not_recovered" and open_.row.data == {"follow_up": "revert"}
    j.decisions.record_verdict(d1, "recovered", "fine", {"follow_up": "none"})
    assert j.decisions.open_recoveries() == []
    # An escalated verdict journals its target's freeze in the same transaction.
    frozen = j.decisions.record_verdict(d1, "not_recovered", "slow again", {"follow_up": "escalate"},
                                        FreezeRequest("ns/m", "escalated: slow again", FOREVER))
    active = j.freezes.active_on("ns/m")
    assert active is not None and (active.id, active.reason, active.until, active.decision_id) == (
        frozen, "escalated: slow again", FOREVER, d1)

    now = time.time()
    a = j.approvals.request(s2, "q", "ns/n", {"steps": []}, deadline=now + 600)
    b = j.approvals.request(s3, "q", "ns/o", {"steps": []}, deadline=now - 1)
    assert a.id != b.id and j.approvals.pending_for("q", "ns/n") == a
    approved = j.approvals.approve(a.id, "alice", "looks right")
    assert approved is not None and approved.status == "approved"
    assert j.approvals.approve(a.id, "alice", "again") is None
    assert [e.id for e in j.approvals.expire()] == [b.id]
    assert [x.status for x in j.approvals.all()] == ["approved", "expired"]
    expired = j.decisions.get(b.decision_id)
    assert expired is not None and f"approval {b.id} expired" in expired.reason
    latest = {(d.policy, d.target): d.state for d in j.decisions.latest()}
    assert latest == {("p", "ns/m"): "succeeded", ("q", "ns/n"): "executing", ("q", "ns/o"): "blocked"}


def test_freezes_guards_evaluations_and_cluster_state(open_journal: OpenJournal):
    """Freezes lift by id list, guard history unions imported marks, evaluations upsert in bulk,
    and merging another leader's state twice changes nothing the second time."""
    j = open_journal()
    f1 = j.freezes.record("ns/m", "slow", FOREVER, by="alice", source="api")
    f2 = j.freezes.record("ns/m", "slower", FOREVER)
    j.freezes.record(DAEMON_SCOPE, "upgrades", time.time() + 60)
    assert [f.by for f in j.freezes.active()] == ["alice", None, None]
    assert [f.id for f in j.freezes.lift("ns/m", "fixed", by="bob", ids=[f2])] == [f2]
    active = j.freezes.active_on("ns/m")
    assert active is not None and active.id == f1

    ((sid, _),), _ = j.signals.record([_signal("k")])
    j.decisions.record(sid, "p", "ns/m", DecisionState.SUCCEEDED, "", {}, executed=True)
    mine = j.decisions.executed_marks(0)[0][2]
    now = time.time()
    bad = BadMark(target="ns/x", version=4, reason="slow", at=now)
    pin = Pin("ns/x", "x", 3, now)
    assert j.cluster.merge([pin], [ExecutedMark("p", "ns/m", now - 10), ExecutedMark("p", "ns/m", mine)], since=0,
                           shared=SharedState(bad_marks=(bad,))) == MergeCounts(pins=1, marks=2, other=1)
    assert j.cluster.merge([pin], [ExecutedMark("p", "ns/m", now - 10)], since=0,
                           shared=SharedState(bad_marks=(bad,))) == MergeCounts(pins=0, marks=0, other=0)
    last, count = j.decisions.guard_history("p", "ns/m", window_seconds=3600)
    assert last == mine and count == 2  # the mark equal to our own plan counts once
    assert j.bad_versions.known("ns/x") == frozenset({4})
    assert [p.version for p in j.pins.live()] == [3]

    j.evaluations.record_many([Verdict("p", 0, "s1", True, "fired"), Verdict("p", 0, "s2", False, "quiet")])
    j.evaluations.record_many([Verdict("p", 0, "s1", False, "calm")])
    assert [(e.series, e.fired, e.reason) for e in j.evaluations.all("p")] == [
        ("s1", False, "calm"), ("s2", False, "quiet")]
    assert j.cluster.shared_state(since=0).bad_marks == (bad,)
