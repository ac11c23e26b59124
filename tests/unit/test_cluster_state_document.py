"""The cluster-state ConfigMap document keeps its format: old and new replicas read and write the
same `state.json` during a rolling upgrade. The documents below were rendered by tailguard 546b308
(before the journal became repositories); a journal that imports one exports it byte for byte."""
from __future__ import annotations

from pathlib import Path

from daemon.cluster.cluster_state import journal_document, parse_document
from daemon.storage.journal import Journal
from daemon.storage.records import BadClear, BadMark, ExecutedMark, FreezeMark, Lift, Pin, PinEnd

# Every section: pins, guard marks, a pin end, bad-version marks in force and a clear, freezes in
# force (one on the whole daemon, until lifted) and a lift.
FULL = ('{"badVersionClears":{"prod/ranker":{"9":{"at":2100.0,"reason":"fixed upstream"}}},'
        '"badVersions":{"prod/ranker":{"12":{"at":1800.25,"reason":"canary failed"},'
        '"3":{"at":1500.0,"reason":"rolled back to 2 by decision 1"}}},'
        '"freezeLifts":{"prod/lifted":{"at":2200.0,"reason":"over","until":8000.0}},'
        '"freezes":{"*":[{"at":1700.0,"reason":"incident","until":253402300799.0}],'
        '"prod/other":[{"at":1650.0,"reason":"maintenance","until":9000.0}]},'
        '"guardMarks":{"other-tail|prod/other":[1600.5],"ranker-tail|prod/ranker":[1500.0,1700.0]},'
        '"pinEnds":{"prod/ended":{"at":1000.0,"endedAt":2000.0,"reason":"rolled forward"}},'
        '"pins":{"prod/other":{"at":1600.5,"model":"other","version":7},'
        '"prod/ranker":{"at":1500.0,"model":"ranker","version":2}},"version":2}')

# Only pins and marks: version 1, which replicas older than the pin ends still read.
PINS_ONLY = ('{"guardMarks":{"ranker-tail|prod/ranker":[1500.0]},'
             '"pins":{"prod/ranker":{"at":1500.0,"model":"ranker","version":2}},"version":1}')

# What the journal held before importing FULL: the pin FULL ends, the mark it clears and the
# freeze it lifts (an end, a clear or a lift only changes rows that exist).
BEFORE = ('{"badVersionClears":{},"badVersions":{"prod/ranker":{"9":{"at":1400.0,"reason":"canary failed"}}},'
          '"freezeLifts":{},"freezes":{"prod/lifted":[{"at":1200.0,"reason":"short","until":8000.0}]},'
          '"guardMarks":{},"pinEnds":{},"pins":{"prod/ended":{"at":1000.0,"model":"ended","version":1}},'
          '"version":2}')

NOW = 3000.0


def _import(journal: Journal, text: str) -> None:
    doc = parse_document(text)
    pins = [Pin(t, p["model"], p["version"], p["at"]) for t, p in doc.pins.items()]
    marks = [ExecutedMark(policy, target, at) for key, times in doc.marks.items()
             for policy, target in [key.split("|", 1)] for at in times]
    journal.cluster.merge(pins, marks, 0.0, doc.shared(), NOW)


def _export(journal: Journal) -> str:
    return journal_document(journal.pins.live(), journal.decisions.executed_marks(0.0),
                            journal.cluster.shared_state(0.0, NOW)).render()


def test_documents_render_as_they_are_read():
    for text in (FULL, PINS_ONLY, BEFORE):
        assert parse_document(text).render() == text


def test_the_shared_sections_read_into_named_records():
    """Each section's fields land where their names say (a bad mark's and a clear's time and reason
    were once positional tuples in two different orders)."""
    shared = parse_document(FULL).shared()
    assert shared.pin_ends == (PinEnd(target="prod/ended", at=1000.0, ended_at=2000.0, reason="rolled forward"),)
    assert set(shared.bad_marks) == {
        BadMark(target="prod/ranker", version=12, reason="canary failed", at=1800.25),
        BadMark(target="prod/ranker", version=3, reason="rolled back to 2 by decision 1", at=1500.0)}
    assert shared.bad_clears == (BadClear(target="prod/ranker", version=9, at=2100.0, reason="fixed upstream"),)
    assert set(shared.freezes) == {FreezeMark(target="*", reason="incident", at=1700.0, until=253402300799.0),
                                   FreezeMark(target="prod/other", reason="maintenance", at=1650.0, until=9000.0)}
    assert shared.lifts == (Lift(target="prod/lifted", at=2200.0, reason="over", until=8000.0),)


def test_a_journal_that_imported_a_document_exports_it_byte_for_byte(tmp_path: Path):
    journal = Journal(tmp_path / "j.db")
    try:
        _import(journal, BEFORE)
        _import(journal, FULL)
        assert _export(journal) == FULL
        _import(journal, FULL)  # idempotent
        assert _export(journal) == FULL
    finally:
        journal.close()


def test_pins_and_marks_alone_stay_a_version_1_document(tmp_path: Path):
    journal = Journal(tmp_path / "j.db")
    try:
        _import(journal, PINS_ONLY)
        assert _export(journal) == PINS_ONLY
    finally:
        journal.close()
