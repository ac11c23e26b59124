"""A journal written by the previous release (387013c, journal schema version 2) opens with this
code: its migrations run, it reads back as that release read it, and it takes new writes, in the
tables added since too.

data/journal_387013c.db is that release's SQLite file itself, not a dump; data/make_journal_387013c.py
made it and data/journal_387013c.reads.json (what that release's reads returned on it) from a
worktree of 387013c, and its `reads` is what this test reads with the current code."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

import pytest

from core.decision import DecisionState
from core.signal import Signal, SignalSource
from daemon.storage.journal import Journal
from daemon.storage.sqlite_backend import MIGRATIONS

DATA = Path(__file__).parent / "data"
STORED = DATA / "journal_387013c.db"


def _maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_journal_387013c", DATA / "make_journal_387013c.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKER = _maker()


def _schema_version(path: Path) -> int:
    # immutable: reads the stored file without creating its -wal and -shm beside it
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return int(conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def old_journal(tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    shutil.copyfile(STORED, path)  # opening migrates it: never the stored file itself
    return path


def test_the_stored_file_has_the_previous_release_schema():
    assert _schema_version(STORED) == 2
    assert max(m.version for m in MIGRATIONS) > 2  # else this test proves nothing about migrations


def test_it_migrates_and_reads_back_as_the_previous_release_read_it(old_journal: Path):
    expected = json.loads((DATA / "journal_387013c.reads.json").read_text())
    j = Journal(old_journal)
    try:
        got = json.loads(json.dumps(MAKER.plain(MAKER.reads(j))))
    finally:
        j.close()
    assert _schema_version(old_journal) == max(m.version for m in MIGRATIONS)
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == expected[name], name


def test_it_takes_new_writes_in_old_tables_and_new(old_journal: Path):
    """Dedup holds for its signals, ids follow its rows, its term is taken over, its recovery is
    resumed, its pin ends, and the tables added since (effects, version starts, shard terms) work."""
    j = Journal(old_journal, clock=lambda: MAKER.NOW)
    try:
        at = datetime(2027, 1, 16, tzinfo=timezone.utc)
        new, duplicates = j.signals.record([Signal(SignalSource.ALERT, "TailLatency", {"model": "ranker"}, at, "k2"),
                                            Signal(SignalSource.ALERT, "TailLatency", {"model": "ranker"}, at, "k9")])
        assert duplicates == 1 and [sid for sid, _ in new] == [6]
        assert j.signals.pending_count() == 3  # 4 and 5 were pending in the old journal
        assert j.terms.take("replica-b").term == 2
        decision = j.decisions.record(6, "ranker-tail", MAKER.RANKER, DecisionState.NOOP, "nothing", {}, False)
        assert decision == 9  # after its 8
        claim = j.read("SELECT holder, term FROM decisions WHERE id=?", (decision,))[0]
        assert (claim["holder"], claim["term"]) == ("replica-b", 2)
        (resumed,) = j.decisions.open_recoveries()
        j.decisions.record_verdict(resumed.decision.id, "recovered", "p99 back under 2s", {})
        assert j.decisions.open_recoveries() == []
        ended = j.pins.end(MAKER.RANKER, "rolled forward")
        assert ended is not None and ended.version == 3 and ended.decision_id == 1
        assert [p.target for p in j.pins.live()] == ["prod/imported"]
        effect = j.effects.record("executor", MAKER.RANKER, "triton.load", "intent", "load 5", {"version": 5},
                                  fenced=True)
        assert [e.id for e in j.effects.of(MAKER.RANKER)] == [effect]
        assert j.starts.record(MAKER.RANKER, "trigger-0", {"5": MAKER.NOW - 60}) == 1
        assert j.starts.of(MAKER.RANKER, "trigger-0") == {"5": MAKER.NOW - 60}
        assert j.shard_terms.take(0, 2, "replica-b").term == 1 and j.shard_terms.sharded()
    finally:
        j.close()
