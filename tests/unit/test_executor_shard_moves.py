"""The executor when its target's shard moves mid-decision (#45), two replicas on one journal file:
- handed back after the decision was journaled `executing` but before step 0: the decision is left
  executing and its signal pending (ShardFenced), and the shard's new leader resumes it: applied once;
- refused by the door mid-apply (the shard lost during the call): the apply's failure is not
  journaled, and the new leader re-observes the step and applies it: applied once, succeeded;
- paused past its Lease while deciding (SIGSTOP): the new leader decided meanwhile; the resumed
  replica's `executing` row is refused by the shard's term, nothing applied, the new leader's row kept.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import pytest

from core.decision import DecisionState
from daemon.cluster.shard_assignment import shard_of
from daemon.storage.journal import Journal
from daemon.storage.shard_terms import ShardFenced
from daemon.workers.executor import Executor
from tests.support.helpers import wait_for
from tests.unit.test_executor import A, MODEL, Harness, _policy

SHARDS = 4
TARGET = f"default/{MODEL}"
SHARD = shard_of(TARGET, SHARDS)


class Replica:
    """One replica's journal connection and its view of the shard (`leads`)."""

    def __init__(self, path: Path, name: str) -> None:
        self.name = name
        self.journal = Journal(path)
        self.journal.shard_terms.route(lambda target: shard_of(target, SHARDS))
        self.leads = False

    def take(self) -> None:
        self.journal.shard_terms.take(SHARD, SHARDS, self.name)
        self.leads = True

    def executor(self, h: Harness, policies: str) -> Executor:
        h.journal = self.journal
        executor = h.executor(policies)
        executor.owns = lambda target: self.leads and shard_of(target, SHARDS) == SHARD
        return executor


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[Harness, Replica, Replica]]:
    a, b = Replica(tmp_path / "j.db", "a"), Replica(tmp_path / "j.db", "b")
    harness = Harness(a.journal, tmp_path / "j.db")
    yield harness, a, b
    await harness.settle()
    a.journal.close()
    b.journal.close()


async def _applies(h: Harness) -> int:
    return sum(1 for c in h.calls if c.phase == "apply")


async def test_a_shard_handed_back_before_step_0_leaves_the_decision_to_the_new_leader(
        two: tuple[Harness, Replica, Replica]) -> None:
    h, a, b = two
    a.take()
    ex_a = a.executor(h, _policy(f"{{type: {A}}}"))
    planned = ex_a._steps.run_plan

    async def handed_back_first(*args, **kwargs):  # type: ignore[no-untyped-def]
        a.leads = False  # a hands the shard back once the decision is journaled executing
        return await planned(*args, **kwargs)

    ex_a._steps.run_plan = handed_back_first  # type: ignore[method-assign]
    signal_id, signal = await h._journaled("alert-1")
    with pytest.raises(ShardFenced, match="stopped before step 0"):
        await ex_a.process(signal_id, signal)
    (decision,) = await a.journal.decisions.all.in_thread()
    assert decision.state == DecisionState.EXECUTING  # not failed: final, no replica would act again
    (stored,) = await a.journal.signals.all.in_thread()
    assert stored.state == "pending"
    assert await _applies(h) == 0

    b.take()
    await b.executor(h, _policy(f"{{type: {A}}}")).process(signal_id, signal)
    (decision,) = await b.journal.decisions.all.in_thread()
    assert decision.state == DecisionState.SUCCEEDED
    assert await _applies(h) == 1 and len(h.effects) == 1
    (stored,) = await b.journal.signals.all.in_thread()
    assert stored.state == "processed"


async def test_an_apply_refused_because_the_shard_moved_is_applied_once_by_the_new_leader(
        two: tuple[Harness, Replica, Replica]) -> None:
    h, a, b = two
    a.take()
    # The first apply fails (as the door's refusal does) while a loses the shard during the call.
    ex_a = a.executor(h, _policy(f"{{type: {A}, apply: [fail, ok], verify: observe}}"))
    action = ex_a._action(A)
    apply = action.apply

    async def lose_during(*args, **kwargs):  # type: ignore[no-untyped-def]
        a.leads = False
        return await apply(*args, **kwargs)

    action.apply = lose_during  # type: ignore[method-assign]
    signal_id, signal = await h._journaled("alert-1")
    with pytest.raises(ShardFenced, match="step 0's apply failed"):
        await ex_a.process(signal_id, signal)
    (decision,) = await a.journal.decisions.all.in_thread()
    assert decision.state == DecisionState.EXECUTING
    assert [(s.phase, s.status) for s in await h.step_rows(decision.id)] == [("intent", "pending")]  # in doubt

    b.take()
    await b.executor(h, _policy(f"{{type: {A}, apply: [fail, ok], verify: observe}}")).process(signal_id, signal)
    (decision,) = await b.journal.decisions.all.in_thread()
    assert decision.state == DecisionState.SUCCEEDED, decision.reason
    assert len(h.effects) == 1  # landed once: a's attempt was not sent


async def test_a_paused_replica_does_not_journal_over_the_new_leaders_decision(
        two: tuple[Harness, Replica, Replica]) -> None:
    h, a, b = two
    a.take()
    ex_a = a.executor(h, _policy(f"{{type: {A}}}"))
    signal_id, signal = await h._journaled("alert-1")
    plan = ex_a._action(A).plan
    paused: list[bool] = []

    def paused_in_plan(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not paused:  # a is stopped here (SIGSTOP) past its Lease: b takes the shard and acts
            paused.append(True)
            b.take()
            b.journal.decisions.record(signal_id, "remediate", TARGET, DecisionState.SUCCEEDED, "by b", {},
                                       executed=True)
        return plan(*args, **kwargs)

    ex_a._action(A).plan = paused_in_plan  # type: ignore[method-assign]
    with pytest.raises(ShardFenced, match="was replaced by term 2 \\(b\\)"):
        await ex_a.process(signal_id, signal)  # a's view of its Lease is stale: it still "leads"
    (decision,) = await a.journal.decisions.all.in_thread()
    assert (decision.state, decision.reason) == (DecisionState.SUCCEEDED, "by b")
    assert await _applies(h) == 0


async def test_a_signal_matching_targets_of_two_shards_is_decided_for_the_shard_led_here(
        two: tuple[Harness, Replica, Replica]) -> None:
    """The leader of the first target's shard decides that target; the other shard's target is skipped
    (its rows are fenced by its shard's term), and the signal is processed."""
    h, a, _ = two
    other = next(f"s{i}" for i in range(100) if shard_of(f"default/s{i}", SHARDS) != SHARD)
    assert f"default/{other}" > TARGET  # the signal's owner is TARGET, led by a

    def policy(name: str, model: str) -> str:
        return (f"name: {name}\ntarget: {{model: {model}}}\ntriggers:\n"
                f"  - alert: {{name: TailLatencyHigh, targetLabel: null}}\n"
                f"actions:\n  - {{type: {A}}}\nverify: {{query: up, below: 1, onNotRecovered: none}}\n")

    a.take()
    ex_a = a.executor(h, policy("p-ranker", MODEL) + "---\n" + policy("p-other", other))
    await h.fire(ex_a)
    decisions = await a.journal.decisions.all.in_thread()
    assert [(d.policy, d.state) for d in decisions] == [("p-ranker", DecisionState.SUCCEEDED)]
    (stored,) = await a.journal.signals.all.in_thread()
    assert stored.state == "processed"


async def test_open_recoveries_are_resumed_only_for_the_targets_of_the_shards_led_here(
        two: tuple[Harness, Replica, Replica]) -> None:
    """Two recovery checks in flight, on targets of two shards, left open by a replica that stopped: a
    replica leading one of the shards resumes that one only (the other's verdict is fenced by its
    shard's term; its leader resumes it when it takes or gains the shard)."""
    h, a, _ = two
    other = next(f"s{i}" for i in range(100) if shard_of(f"default/s{i}", SHARDS) != SHARD)
    check = "{query: p999, below: 500, for: 2s, within: 8s, interval: 1s, onNotRecovered: none}"

    def policy(name: str, model: str) -> str:
        return (f"name: {name}\ntarget: {{model: {model}}}\ntriggers:\n"
                f"  - alert: {{name: TailLatencyHigh, targetLabel: null}}\n"
                f"actions:\n  - {{type: {A}}}\nverify: {check}\n")

    policies = policy("p-ranker", MODEL) + "---\n" + policy("p-other", other)
    a.take()
    a.journal.shard_terms.take(shard_of(f"default/{other}", SHARDS), SHARDS, "a")
    h.advance, h.gate = True, asyncio.Event()
    first = h.executor(policies, query=lambda t: 900.0)
    first.owns = lambda target: True  # a led both shards then
    await h.fire(first)
    await wait_for(lambda: len(h.sleeps) >= 2, timeout=10)
    await first.close()  # a stopped: both checks stay open in the journal
    assert len(await a.journal.decisions.open_recoveries.in_thread()) == 2

    second = a.executor(h, policies)  # leads SHARD only
    assert await second.resume_verifications() == 1
    assert await second.resume_verifications() == 0  # already running
