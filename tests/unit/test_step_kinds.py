"""Step rows journaled as typed records come back as the enums, stored as the plain strings earlier
releases wrote; a phase or status this release does not name (another release's) still reads."""
from __future__ import annotations

import dataclasses
import sqlite3
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path

import pytest

from core.decision import DecisionState
from core.signal import Signal, SignalSource
from daemon.storage.journal import Journal
from daemon.storage.records import StepRecord
from daemon.storage.step_kinds import StepPhase, StepStatus


def _decision(j: Journal) -> int:
    (sid, _), = j.signals.record([Signal(SignalSource.ALERT, "A", {"model": "m"}, datetime.now(timezone.utc), "k")])[0]
    return j.decisions.record(sid, "p", "ns/m", DecisionState.SUCCEEDED, "", {}, executed=True)


def test_a_step_record_reads_back_as_enums_and_is_stored_as_plain_strings(tmp_path: Path):
    j = Journal(tmp_path / "j.db")
    try:
        d = _decision(j)
        j.decisions.record_step(StepRecord(d, 0, "notify", StepPhase.APPLY, StepStatus.NOOP, "sent", {"n": 1}, 0.5))
        j.decisions.record_verdict(d, StepStatus.NOT_RECOVERED, "still slow", {"follow_up": "revert"})
        first, verdict = j.decisions.steps(d)
        assert (first.phase, first.status, first.data, first.duration_seconds) == (
            StepPhase.APPLY, StepStatus.NOOP, {"n": 1}, 0.5)
        assert first.phase is StepPhase.APPLY and first.status is StepStatus.NOOP
        assert (verdict.idx, verdict.action, verdict.phase, verdict.status) == (
            -1, "recovery", StepPhase.RECOVERY, StepStatus.NOT_RECOVERED)
        (opened,) = j.decisions.open_recoveries()  # a verdict asking for a revert not yet done
        assert opened.row.status is StepStatus.NOT_RECOVERED
    finally:
        j.close()
    with closing(sqlite3.connect(tmp_path / "j.db")) as db:
        assert db.execute("SELECT phase, typeof(phase), status, typeof(status) FROM steps ORDER BY id").fetchall() == [
            ("apply", "text", "noop", "text"), ("recovery", "text", "not_recovered", "text")]


def test_a_phase_or_status_another_release_wrote_reads_back_as_stored(tmp_path: Path):
    j = Journal(tmp_path / "j.db")
    try:
        d = _decision(j)
        j.write(lambda db: db.execute(
            "INSERT INTO steps(decision_id, idx, action, phase, status, message, data, at, duration_seconds)"
            " VALUES (?, 0, 'notify', 'dry_plan', 'deferred', '', '{}', 1.0, NULL)", (d,)))
        (row,) = j.decisions.steps(d)
        assert (row.phase, row.status) == ("dry_plan", "deferred")
        assert row.phase not in list(StepPhase) and row.status not in list(StepStatus)
    finally:
        j.close()


def test_a_step_record_is_frozen():
    step = StepRecord(1, 0, "notify", StepPhase.INTENT, StepStatus.PENDING, "", {})
    assert step.duration_seconds is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.status = StepStatus.OK  # type: ignore[misc]
