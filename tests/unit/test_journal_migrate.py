"""`tailguard journal migrate --to postgresql://...`: a SQLite journal copied into PostgreSQL with
its ids, history, pins, freezes and approvals; `tailguard journal` reads either backend."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from core.decision import DecisionState
from core.signal import Signal, SignalSource
from daemon.common.config import ConfigError, JournalSettings, journal_store
from daemon.storage.journal import Journal
from daemon.storage.records import FOREVER, ExecutedMark, StepRecord
from daemon.storage.step_kinds import StepPhase, StepStatus
from daemon.wiring.cli import main


def _signal(key: str) -> Signal:
    return Signal(SignalSource.ALERT, "A", {"model": "m"}, datetime.now(timezone.utc), key)


def _fill(path: Path) -> None:
    """A journal with a row in every table."""
    j = Journal(path)
    try:
        (s1, _), (s2, _), _ = j.signals.record([_signal("a"), _signal("b"), _signal("pending")])[0]
        d1 = j.decisions.record(s1, "p", "ns/m", DecisionState.SUCCEEDED, "rolled back", {"steps": [1]}, executed=True)
        j.decisions.record_step(StepRecord(d1, 0, "triton.rollback", StepPhase.APPLY, StepStatus.OK, "loaded 1",
                                           {"version": 1}, 0.5))
        j.signals.mark_processed([s1, s2])
        j.approvals.request(s2, "q", "ns/n", {"steps": []}, deadline=time.time() + 600)
        j.evaluations.record("p", 0, "series", True, "fired")
        j.pins.record("ns/m", "m", 1, from_version=2, decision_id=d1, reason="tail", policy="p")
        j.pins.record("ns/o", "o", 3)
        j.pins.end("ns/o", "rolled forward")
        j.freezes.record("ns/m", "did not help", FOREVER, d1, by="alice", source="api")
        j.cluster.merge([], [ExecutedMark("p", "ns/z", time.time())], since=0)
    finally:
        j.close()


def _snapshot(j: Journal) -> dict[str, object]:
    return {"signals": j.signals.all(), "decisions": j.decisions.all(), "steps": j.decisions.steps(1),
            "approvals": j.approvals.all(),
            "evaluations": j.evaluations.all(), "pins": j.pins.live(), "ended": j.pins.ended(),
            "bad": j.bad_versions.of("ns/m", include_cleared=True), "freezes": j.freezes.all(),
            "marks": j.decisions.executed_marks(0), "pending": j.signals.pending_count()}


@pytest.mark.integration
def test_migrate_copies_a_sqlite_journal_into_postgres(tmp_path: Path, postgres_dsn: str,
                                                       capsys: pytest.CaptureFixture[str]):
    """Everything arrives with its ids; new rows get ids after them; dedup holds for copied keys;
    a second migrate into the now non-empty database is refused and changes nothing."""
    path = tmp_path / "j.db"
    _fill(path)
    lite = Journal(path)
    before = _snapshot(lite)
    lite.close()

    assert main(["journal", "migrate", "--to", postgres_dsn, str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"]["signals"] == 3 and report["rows"]["guard_marks"] == 1

    pg = Journal(postgres_dsn)
    try:
        assert _snapshot(pg) == before
        new, dup = pg.signals.record([_signal("a"), _signal("c")])
        assert dup == 1 and new[0][0] > 3  # after the copied ids (PostgreSQL ids may have gaps)
        assert pg.decisions.record(new[0][0], "p", "ns/m", DecisionState.NOOP, "", {}, executed=False) > 2
    finally:
        pg.close()

    assert main(["journal", "migrate", "--to", postgres_dsn, str(path)]) == 1
    assert "not empty" in capsys.readouterr().err


@pytest.mark.integration
def test_journal_prints_either_backend(tmp_path: Path, postgres_dsn: str, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "j.db"
    _fill(path)
    assert main(["journal", str(path)]) == 0
    from_sqlite = capsys.readouterr().out
    assert main(["journal", "migrate", "--to", postgres_dsn, str(path)]) == 0
    capsys.readouterr()
    assert main(["journal", postgres_dsn]) == 0
    assert capsys.readouterr().out == from_sqlite
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"journal": {"backend": "postgres", "dsnFile": "dsn"}}))
    (tmp_path / "dsn").write_text(postgres_dsn + "\n")
    assert main(["journal", "--config", str(config)]) == 0
    assert capsys.readouterr().out == from_sqlite


def test_journal_command_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["journal", str(tmp_path / "missing.db")]) == 1
    with pytest.raises(SystemExit):
        main(["journal", "migrate", str(tmp_path / "missing.db")])  # no --to
    assert main(["journal", "migrate", "--to", "mysql://x", str(tmp_path)]) == 2
    capsys.readouterr()


def test_the_dsn_comes_from_env_then_file_then_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text("postgresql://u@db/file\n")
    settings = JournalSettings.model_validate({"backend": "postgres", "dsn": "postgresql://u@db/config",
                                               "dsnFile": str(dsn_file)})
    monkeypatch.setenv("TAILGUARD_JOURNAL_DSN", "postgresql://u@db/env")
    assert journal_store(settings) == "postgresql://u@db/env"
    monkeypatch.delenv("TAILGUARD_JOURNAL_DSN")
    assert journal_store(settings) == "postgresql://u@db/file"
    assert journal_store(settings.model_copy(update={"dsn_file": None})) == "postgresql://u@db/config"
    with pytest.raises(ConfigError, match="needs a postgresql:// DSN"):
        journal_store(JournalSettings.model_validate({"backend": "postgres"}))
    with pytest.raises(ValueError, match="for backend: postgres"):
        JournalSettings.model_validate({"dsn": "postgresql://u@db/x"})
    assert journal_store(JournalSettings()) == Path(".tailguard/journal.db")
