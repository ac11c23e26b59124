"""Writes journal_387013c.db and journal_387013c.reads.json with the tailguard on sys.path.

Run from a worktree of 387013c (the release before 2026-12-06's work, journal schema version 2):

    git worktree add --detach /tmp/tg-prev 387013c
    cd /tmp/tg-prev && /work/main/.venv/bin/python /work/main/tests/unit/data/make_journal_387013c.py \
        /work/main/tests/unit/data
    git worktree remove /tmp/tg-prev

`reads` is also what tests/unit/test_journal_previous_release.py reads with the current code: one
list of reads, run by both releases. Every stamp comes from a fixed clock, so the file is the
same each time it is made (but for SQLite's own bytes)."""
from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

START = 1_800_000_000.0  # the first row's stamp; each write takes the next second
NOW = 1_900_000_000.0  # the reads' time (the far-future freezes still in force)
RANKER, OTHER = "prod/ranker", "prod/other"


def plain(v: object) -> object:
    """A read as JSON has it: dataclasses as objects, enums as values, sets sorted, tuples as lists."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, frozenset, set)):
        return [plain(x) for x in (sorted(v) if isinstance(v, (frozenset, set)) else v)]
    return v


def reads(j: Any) -> dict[str, Any]:
    """Every read of the journal's repositories that 387013c had, on the rows `write` made."""
    decisions = j.decisions.all()
    shared = j.cluster.shared_state(0, now=NOW)
    return {
        "signals": j.signals.all(),
        "pending_signals": j.signals.pending(),
        "pending_after": j.signals.pending(limit=1, after_id=3),
        "signals_since": j.signals.since(0),
        "signal": j.signals.get(2),
        "pending_count": j.signals.pending_count(),
        "decisions": decisions,
        "decisions_of": j.decisions.all("ranker-tail"),
        "decision": j.decisions.get(1),
        "decision_for": j.decisions.for_signal(2, "ranker-tail"),
        "unfinished": j.decisions.unfinished_for_signal(4),
        "steps": {d.id: j.decisions.steps(d.id) for d in decisions},
        "open_recoveries": j.decisions.open_recoveries(),
        "latest_decisions": j.decisions.latest(),
        "guard_history": j.decisions.guard_history("ranker-tail", RANKER, 10 * 365 * 86400, now=NOW),
        "executed_marks": j.decisions.executed_marks(0),
        "freezes": j.freezes.all(),
        "freezes_of": j.freezes.all(OTHER),
        "active_freezes": j.freezes.active(now=NOW),
        "active_freeze": j.freezes.active_on(RANKER, now=NOW),
        "approvals": j.approvals.all(),
        "approvals_expired": j.approvals.all("expired"),
        "approval": j.approvals.get(1),
        "pending_approval": j.approvals.pending_for("other-tail", OTHER),
        "evaluations": j.evaluations.all(),
        "evaluations_of": j.evaluations.all("ranker-tail"),
        "pins": j.pins.live(),
        "ended_pins": j.pins.ended(),
        "ended_pins_of": j.pins.ended(OTHER),
        "bad_versions": j.bad_versions.of(RANKER, include_cleared=True),
        "bad_versions_in_force": j.bad_versions.of(RANKER),
        "known_bad": j.bad_versions.known(RANKER),
        "current_term": j.terms.current(),
        "shared_state": {name: [dataclasses.astuple(entry) for entry in getattr(shared, name)]
                         for name in ("pin_ends", "bad_marks", "bad_clears", "freezes", "lifts")},
    }


def write(j: Any) -> None:
    """A little of everything the acting path and the operators write, through the release's API."""
    from core.decision import DecisionState
    from core.signal import Signal, SignalSource

    at = datetime(2027, 1, 15, 8, 0, 0, tzinfo=timezone.utc)

    def signal(name: str, key: str, model: str = "ranker") -> Any:
        return Signal(SignalSource.ALERT, name, {"model": model, "severity": "page"}, at, key)

    j.terms.take("replica-a", lease_transitions=3)
    new, dup = j.signals.record([signal("TailLatency", "k1"), signal("TailLatency", "k2"),
                                 signal("TailLatency", "k1"), signal("ErrorRate", "k3", "other"),
                                 signal("TailLatency", "k4"), signal("Quiet", "k5")])
    assert dup == 1 and [sid for sid, _ in new] == [1, 2, 3, 4, 5], (new, dup)

    # 1: a rollback that succeeded, pinned, its recovery failed and escalated to a freeze.
    d1 = j.decisions.record(1, "ranker-tail", RANKER, DecisionState.EXECUTING, "p99 over 2s",
                            {"actions": [{"action": "triton.rollback", "to": "previous"}]}, True)
    j.decisions.record_step(d1, 0, "triton.rollback", "plan", "ok", "roll back to 3", {"from": 4, "to": 3}, None)
    j.decisions.record_step(d1, 0, "triton.rollback", "apply", "ok", "loaded 3", {"replicas": ["a", "b"]}, 1.25)
    j.decisions.record_step(d1, 0, "triton.rollback", "verify", "ok", "3 serving", {}, 0.5)
    j.pins.record(RANKER, "ranker", 3, from_version=4, decision_id=d1, reason="p99 over 2s", policy="ranker-tail")
    j.decisions.finish(d1, DecisionState.SUCCEEDED, "rolled back to 3", recovery=("checking p99", {"window": 300}))
    j.decisions.record_verdict(d1, "not_recovered", "p99 still over 2s", {"follow_up": "freeze"},
                               freeze=(RANKER, "escalated: not recovered", 253402300799.0))

    # 2: succeeded, its recovery still pending (what a restart resumes).
    d2 = j.decisions.record(2, "ranker-tail", RANKER, DecisionState.EXECUTING, "p99 over 2s again",
                            {"actions": [{"action": "notify"}]}, True)
    j.decisions.record_step(d2, 0, "notify", "apply", "ok", "sent", {"channel": "#ops"}, 0.01)
    j.decisions.finish(d2, DecisionState.SUCCEEDED, "notified", recovery=("checking", {"window": 60}))

    # 3: noop and an expired decision on the other target; 4: still executing.
    j.decisions.record(3, "other-tail", OTHER, DecisionState.NOOP, "nothing to do", {}, False)
    d4 = j.decisions.record(3, "other-errors", OTHER, DecisionState.EXECUTING, "errors", {"actions": []}, True)
    j.decisions.finish(d4, DecisionState.EXPIRED, "expired before applying",
                       expired={"why": "signal too old", "age_seconds": 900.0})
    j.decisions.record(4, "ranker-tail", RANKER, DecisionState.EXECUTING, "in flight", {"actions": []}, True)

    # Approvals: one approved, one expired, one pending.
    a1 = j.approvals.request(5, "ranker-approve", RANKER, {"actions": [{"action": "triton.rollback"}]}, START + 10_000)
    j.approvals.approve(a1.id, "alice", "looks right")
    j.approvals.request(4, "other-tail", OTHER, {"actions": []}, START + 30)
    j.approvals.expire(now=START + 100)
    j.approvals.request(5, "other-tail", OTHER, {"actions": []}, NOW + 86_400)

    j.evaluations.record("ranker-tail", 0, "ranker/4", True, "p99 2.4s > 2s")
    j.evaluations.record_many([("ranker-tail", 0, "ranker/3", False, "p99 0.4s"),
                               ("other-tail", 1, "other/7", False, "no data")])

    # Pins: one live (above), one ended with its marks cleared, one imported; bad marks by hand.
    j.pins.record(OTHER, "other", 6, from_version=7, reason="errors")
    j.pins.clear(OTHER, "rollback reverted")
    j.pins.record(OTHER, "other", 5, reason="held by hand")
    j.pins.end(OTHER, "released")
    j.bad_versions.mark(RANKER, 5, "bad canary", decision_id=d2)
    j.bad_versions.mark(RANKER, 2, "old crash")
    j.bad_versions.clear(RANKER, 2, "fixed in a rebuild")

    # Freezes: by an operator, lifted, and daemon-wide.
    j.freezes.record(OTHER, "maintenance", NOW + 86_400, by="bob", source="api")
    j.freezes.record(OTHER, "short", START + 5)
    j.freezes.lift(OTHER, "done", now=START + 2, by="bob")
    j.freezes.record("*", "change freeze", NOW + 3_600, by="carol", source="cli")

    # What another leader shared.
    from daemon.storage.records import SharedState
    j.cluster.merge([("prod/imported", "imported", 9, START + 50)], [("imported-tail", "prod/imported", START + 60)],
                    START, SharedState(), now=START + 70)

    j.signals.mark_processed([1, 2, 3])


def main(out: Path) -> None:
    from daemon.storage.journal import Journal

    db = out / "journal_387013c.db"
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)
    stamps = itertools.count()
    j = Journal(db, clock=lambda: START + next(stamps))
    try:
        write(j)
        got = plain(reads(j))
    finally:
        j.close()
    (out / "journal_387013c.reads.json").write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
