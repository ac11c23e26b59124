"""Decision rows fenced per shard (#45), on both backends: with sharding on, a replica whose term for a
target's shard was replaced (paused past its Lease, or it handed the shard back) cannot journal the
target's decision, its steps, its end or its verdict over the new leader's (ShardFenced, as the
door's intents); another shard's term does not fence it, and a process without sharding is fenced by
the core term only, as before."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from core.decision import DecisionState
from core.signal import Signal, SignalSource
from daemon.cluster.shard_assignment import shard_of
from daemon.storage.errors import JournalFenced
from daemon.storage.journal import Journal
from daemon.storage.records import StepRecord
from daemon.storage.shard_terms import ShardFenced
from daemon.storage.step_kinds import StepPhase, StepStatus
from tests.support.journal_backends import OpenJournal

SHARDS = 4
TARGET = "default/ranker"
SHARD = shard_of(TARGET, SHARDS)
OTHER = next(f"default/m{i}" for i in range(100) if shard_of(f"default/m{i}", SHARDS) != SHARD)


def _routed(journal: Journal) -> Journal:
    journal.shard_terms.route(lambda target: shard_of(target, SHARDS))
    return journal


def _signal(journal: Journal, key: str = "alert-1") -> int:
    signal = Signal(SignalSource.ALERT, "TailLatencyHigh", {"model": "ranker"}, datetime.now(timezone.utc), key)
    ((signal_id, _),), _ = journal.signals.record([signal])
    return signal_id


def test_a_replaced_shard_holder_cannot_journal_over_the_new_leaders_decision(open_journal: OpenJournal) -> None:
    a, b = _routed(open_journal()), _routed(open_journal())
    a.shard_terms.take(SHARD, SHARDS, "a")
    sid = _signal(a)
    decision = a.decisions.record(sid, "p", TARGET, DecisionState.EXECUTING, "applying", {}, executed=True)
    a.decisions.record_step(StepRecord(decision, 0, "test.a", StepPhase.INTENT, StepStatus.PENDING, "attempt 1", {}))
    # a pauses (SIGSTOP) past its Lease; b takes the shard over and finishes the decision.
    b.shard_terms.take(SHARD, SHARDS, "b")
    b.decisions.record_step(StepRecord(decision, 0, "test.a", StepPhase.APPLY, StepStatus.OK, "applied", {}))
    b.decisions.finish(decision, DecisionState.SUCCEEDED, "1 step(s) applied and verified")
    # a resumes (SIGCONT): every write of the target's decision is refused, nothing lands.
    refused = [
        lambda: a.decisions.record(sid, "p", TARGET, DecisionState.BLOCKED, "cooldown: last action -2s ago", {},
                                   executed=False),
        lambda: a.decisions.finish(decision, DecisionState.FAILED, "stopped before step 0"),
        lambda: a.decisions.record_step(StepRecord(decision, 0, "test.a", StepPhase.APPLY, StepStatus.FAILED,
                                                   "refused", {})),
        lambda: a.decisions.record_verdict(decision, StepStatus.OK, "recovered", {}),
    ]
    for write in refused:
        with pytest.raises(ShardFenced, match="was replaced by term 2 \\(b\\)"):
            write()
    assert issubclass(ShardFenced, JournalFenced)  # the backlog leaves the signal to the new leader
    row = b.decisions.get(decision)
    assert row is not None and row.state == DecisionState.SUCCEEDED and row.executed
    assert [(s.phase, s.status) for s in b.decisions.steps(decision)] == [("intent", "pending"), ("apply", "ok")]


def test_another_shards_term_does_not_fence_and_an_unrouted_process_is_not_fenced(open_journal: OpenJournal) -> None:
    a, b, plain = _routed(open_journal()), _routed(open_journal()), open_journal()
    a.shard_terms.take(SHARD, SHARDS, "a")
    a.shard_terms.take(shard_of(OTHER, SHARDS), SHARDS, "a")
    b.shard_terms.take(SHARD, SHARDS, "b")
    sid = _signal(a)
    a.decisions.record(sid, "p-other", OTHER, DecisionState.NOOP, "", {}, executed=False)  # its shard is a's
    with pytest.raises(ShardFenced):
        a.decisions.record(sid, "p", TARGET, DecisionState.NOOP, "", {}, executed=False)
    with pytest.raises(ShardFenced, match="holds no term for shard"):  # routed, never took this shard
        _routed(open_journal()).decisions.record(sid, "p", TARGET, DecisionState.NOOP, "", {}, executed=False)
    # No sharding in this process: the core term alone fences (it took none: not fenced).
    assert plain.decisions.record(sid, "p", TARGET, DecisionState.NOOP, "", {}, executed=False) > 0
