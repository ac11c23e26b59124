"""Fencing: the journal hands each new leader a term; writes of the acting path from a replica whose
term was taken over are refused, on both backends, so two replicas never act on one signal."""
from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest

from core.signal import Signal, SignalSource
from daemon.storage.errors import JournalError, JournalFenced
from daemon.storage.journal import Journal
from daemon.storage.records import StepRecord
from daemon.storage.step_kinds import StepPhase, StepStatus
from tests.support.journal_backends import OpenJournal


def _signal(key: str) -> Signal:
    return Signal(SignalSource.ALERT, "A", {"model": "m"}, datetime.now(timezone.utc), key)


def test_terms_increase_with_each_takeover_and_survive_reopening(open_journal: OpenJournal):
    a, b = open_journal(), open_journal()
    assert a.terms.current() is None
    first = a.terms.take("tailguard-a", lease_transitions=0)
    second = b.terms.take("tailguard-b", lease_transitions=1)
    assert (first.term, second.term) == (1, 2)
    a.close()
    again = open_journal()
    now = again.terms.current()
    assert now is not None and (now.term, now.holder, now.lease_transitions) == (2, "tailguard-b", 1)
    assert again.terms.take("tailguard-a").term == 3


def test_a_replaced_leader_cannot_claim_decide_or_step(open_journal: OpenJournal):
    """The old leader (a) keeps its term after b took a newer one: every acting write of a is
    refused and nothing of it lands; b's writes, and a's webhook intake, go through."""
    a, b = open_journal(), open_journal()
    a.terms.take("tailguard-a")
    (sid, _), = a.signals.record([_signal("s1")])[0]
    decision = a.decisions.record(sid, "p", "ns/m", "executing", "", {}, executed=True)
    b.terms.take("tailguard-b")

    with pytest.raises(JournalFenced, match="term 1 of tailguard-a was replaced by term 2"):
        a.decisions.record_step(StepRecord(decision, 0, "notify", StepPhase.INTENT, StepStatus.PENDING, "", {}))
    with pytest.raises(JournalFenced):
        a.decisions.record(sid, "p", "ns/m", "succeeded", "", {}, executed=True)
    with pytest.raises(JournalFenced):
        a.decisions.finish(decision, "succeeded", "done")
    with pytest.raises(JournalFenced):
        a.signals.mark_processed([sid])
    with pytest.raises(JournalFenced):
        a.pins.record("ns/m", "m", 1)
    assert a.decisions.steps(decision) == [] and a.pins.live() == []
    assert [s.state for s in a.signals.all()] == ["pending"]
    a.signals.record([_signal("s2")])  # any replica may still accept webhooks

    # The new leader resumes the signal: its claim replaces a's on the decision row.
    assert b.decisions.record(sid, "p", "ns/m", "succeeded", "resumed", {}, executed=True) == decision
    row = b.read("SELECT holder, term, state FROM decisions WHERE id=?", (decision,))[0]
    assert (row["holder"], row["term"], row["state"]) == ("tailguard-b", 2, "succeeded")
    b.signals.mark_processed([sid])
    # Each process counted only its own writes: a refresh reads the shared backlog (s2 pending).
    assert b.signals.pending_count() == 0 and a.signals.pending_count() == 2
    assert a.signals.refresh_pending() == 1 and b.signals.refresh_pending() == 1 and a.signals.pending_count() == 1


def test_a_process_that_never_took_a_term_is_not_fenced(open_journal: OpenJournal):
    """Without leader election (one replica) or for operator commands on their own journal handle."""
    leader, operator = open_journal(), open_journal()
    leader.terms.take("tailguard-a")
    (sid, _), = operator.signals.record([_signal("s")])[0]
    operator.decisions.record(sid, "p", "ns/m", "blocked", "by hand", {}, executed=False)
    assert operator.fence is None


def test_a_takeover_waits_for_a_fenced_write_in_flight(open_journal: OpenJournal):
    """The check and the write are one transaction holding the term row: a takeover that starts
    while the old leader's write is in flight lands after it, never between check and write."""
    a, b = open_journal(), open_journal()
    a.terms.take("tailguard-a")
    (sid, _), = a.signals.record([_signal("s")])[0]
    checked, release = threading.Event(), threading.Event()
    original = a._check_fence

    def slow_check() -> None:
        original()
        checked.set()
        release.wait(10)

    a._check_fence = slow_check  # type: ignore[method-assign]
    writer = threading.Thread(target=lambda: a.decisions.record(sid, "p", "ns/m", "executing", "", {}, True))
    writer.start()
    assert checked.wait(10)
    taken: list[int] = []
    taker = threading.Thread(target=lambda: taken.append(b.terms.take("tailguard-b").term))
    taker.start()
    taker.join(0.5)
    assert taken == [], "the takeover committed while a fenced write was between its check and commit"
    release.set()
    writer.join(10)
    taker.join(10)
    assert taken == [2]
    row = b.read("SELECT holder, term FROM decisions WHERE signal_id=?", (sid,))[0]
    assert (row["holder"], row["term"]) == ("tailguard-a", 1)


@pytest.mark.integration
def test_a_leader_frozen_inside_a_transaction_does_not_block_the_takeover(postgres_dsn: str):
    """PostgreSQL: a replica frozen between its fence check and its commit (a long pause, a stopped
    VM) holds the term row; the server ends its session after the idle-in-transaction timeout, so the
    next leader's takeover goes through, and the frozen write, when it wakes, fails instead of landing."""
    a, b = Journal(postgres_dsn), Journal(postgres_dsn)
    try:
        a.terms.take("tailguard-a")
        (sid, _), = a.signals.record([_signal("s")])[0]
        checked, release = threading.Event(), threading.Event()
        original = a._check_fence

        def frozen_check() -> None:
            original()
            checked.set()
            release.wait(30)

        a._check_fence = frozen_check  # type: ignore[method-assign]
        failed: list[Exception] = []

        def write() -> None:
            try:
                a.decisions.record(sid, "p", "ns/m", "executing", "", {}, True)
            except JournalError as exc:
                failed.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        assert checked.wait(10)
        assert b.terms.take("tailguard-b").term == 2  # waits out the server's timeout, not the frozen writer
        release.set()
        writer.join(10)
        assert len(failed) == 1
        assert b.decisions.all() == []
    finally:
        release.set()
        a.close()
        b.close()
