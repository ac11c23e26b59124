"""Shard terms (daemon/storage/shard_terms.py) and the door's shard check, on both backends: a write on
a target is journaled only under the current term of the target's shard, and a rolling upgrade from
the single-leader release is safe (the shard terms supersede the old term; an old leader's writes are
refused, and a single leader taking a term later fences the sharded replicas until they take one anew)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from actions.base import ActionDeps, Effect, Refused
from core.decision import DecisionState
from daemon.cluster.shard_assignment import shard_of
from daemon.common.metrics import Metrics
from daemon.storage.errors import JournalFenced
from daemon.storage.journal import Journal
from daemon.storage.shard_terms import SHARDED, ShardCountMismatch, ShardFenced
from daemon.workers.door import EXECUTOR, Door, acting
from daemon.workers.state import ExecutorState
from policies.loader import PolicySet
from tests.support.journal_backends import OpenJournal

SHARDS = 4
TARGET = "default/ranker"
SHARD = shard_of(TARGET, SHARDS)


@dataclass
class Gate:
    """A ShardGate whose led shards a test sets."""

    led: set[int] = field(default_factory=set)
    fence_seconds: float = 0.0
    lose_during_fence: bool = False

    def shard_of(self, target: str) -> int:
        return shard_of(target, SHARDS)

    def may_write(self, shard: int) -> bool:
        return shard in self.led

    def write_fence_seconds(self, shard: int, request_timeout_seconds: float) -> float:
        wait, self.fence_seconds = self.fence_seconds, 0.0
        if wait and self.lose_during_fence:
            self.led.discard(shard)
        return wait


def _door(journal: Journal, gate: Gate | None) -> Door:
    return Door(journal, ExecutorState(PolicySet(())), ActionDeps(), lambda: True, Metrics(), shards=gate)


async def _write(door: Door) -> str:
    async def send() -> str:
        return "sent"

    with acting(EXECUTOR, TARGET, 1):
        return await door.write(Effect("triton.load", "load v2", loads=2), send)


def test_terms_per_shard_increase_and_move_the_journal_into_the_sharded_regime(open_journal: OpenJournal) -> None:
    a, b = open_journal(), open_journal()
    assert a.shard_terms.current() == {} and not a.shard_terms.sharded()
    assert a.shard_terms.take(0, SHARDS, "a").term == 1
    assert b.shard_terms.take(0, SHARDS, "b").term == 2
    assert b.shard_terms.take(1, SHARDS, "b").term == 1
    now = a.shard_terms.current()
    assert {s: (t.term, t.holder) for s, t in now.items()} == {0: (2, "b"), 1: (1, "b")}
    assert a.shard_terms.sharded()
    regime = a.terms.current()
    assert regime is not None and regime.holder == SHARDED and regime.term == 1  # moved in once, not per take


def test_a_shard_count_other_than_the_journals_is_refused(open_journal: OpenJournal) -> None:
    a = open_journal()
    a.shard_terms.take(0, SHARDS, "a")
    with pytest.raises(ShardCountMismatch, match="sharding.shards=4, this replica has 8"):
        a.shard_terms.take(0, 8, "b")
    with pytest.raises(ValueError, match="not in 0..3"):
        a.shard_terms.take(4, SHARDS, "a")


async def test_the_door_refuses_a_shard_this_replica_does_not_lead(open_journal: OpenJournal) -> None:
    journal = open_journal()
    gate = Gate()
    door = _door(journal, gate)
    with pytest.raises(Refused) as refused:
        await _write(door)
    assert refused.value.check == "shard" and f"shard {SHARD}" in refused.value.reason
    gate.led.add(SHARD)  # the Lease says yes, but no term was taken: the journal says no
    with pytest.raises(Refused) as refused:
        await _write(door)
    assert refused.value.check == "shard" and "holds no term" in refused.value.reason
    journal.shard_terms.take(SHARD, SHARDS, "a")
    assert await _write(door) == "sent"


async def test_a_replaced_shard_holder_is_refused_by_the_journal(open_journal: OpenJournal) -> None:
    a, b = open_journal(), open_journal()
    door_a, door_b = _door(a, Gate({SHARD})), _door(b, Gate({SHARD}))
    a.shard_terms.take(SHARD, SHARDS, "a")
    assert await _write(door_a) == "sent"
    b.shard_terms.take(SHARD, SHARDS, "b")  # b took the shard's Lease over; a has not noticed yet
    with pytest.raises(Refused) as refused:
        await _write(door_a)
    assert refused.value.check == "shard" and "was replaced by term 2 (b)" in refused.value.reason
    assert await _write(door_b) == "sent"
    # Another shard's term changing does not fence this one.
    other = (SHARD + 1) % SHARDS
    a.shard_terms.take(other, SHARDS, "a")
    assert await _write(door_b) == "sent"
    intents = [r for r in a.effects.of(TARGET) if r.status == "intent"]
    assert len(intents) == 3


async def test_mixed_rollout_old_single_leader_and_sharded_replica(open_journal: OpenJournal) -> None:
    """A rolling upgrade: the old release's leader (one term, no shards) and a new sharded replica on
    one journal. Once the new replica takes a shard term, every fenced write of the old leader is
    refused (its door's intent and its decision claims alike); if the old leader then takes a new term
    (it re-acquired its Lease), the sharded replica is refused until it takes a shard term again."""
    old, new = open_journal(), open_journal()
    old_door, new_door = _door(old, None), _door(new, Gate({SHARD}))
    old.terms.take("old-leader", lease_transitions=0)
    assert await _write(old_door) == "sent"
    new.shard_terms.take(SHARD, SHARDS, "new-0")
    with pytest.raises(Refused) as refused:
        await _write(old_door)
    assert refused.value.check == "fence" and SHARDED in refused.value.reason
    with pytest.raises(JournalFenced):  # its decisions too, not only the door's intents
        old.decisions.record(1, "p", TARGET, DecisionState.EXECUTING, "", {}, executed=True)
    assert await _write(new_door) == "sent"
    # The old leader re-takes a term: the single-leader regime is back, and the shard term no longer fences.
    old.terms.take("old-leader", lease_transitions=1)
    with pytest.raises(Refused) as refused:
        await _write(new_door)
    assert refused.value.check == "shard" and "single leader" in refused.value.reason
    with pytest.raises(ShardFenced):
        new.shard_terms.check(SHARD)  # outside a door: the same check, raised as is
    assert await _write(old_door) == "sent"
    other = (SHARD + 1) % SHARDS
    assert new.shard_terms.stale(frozenset({SHARD, other})) == {SHARD, other}  # what the shard manager asks
    new.shard_terms.take(SHARD, SHARDS, "new-0")  # the shard manager re-takes: old is fenced again
    assert new.shard_terms.stale(frozenset({SHARD})) == frozenset()
    assert new.shard_terms.stale(frozenset({other})) == {other}  # never taken by this process
    assert await _write(new_door) == "sent"
    with pytest.raises(Refused):
        await _write(old_door)
    sent = [(r.status, r.data.get("check")) for r in old.effects.of(TARGET) if r.status != "done"]
    assert sent.count(("intent", None)) == 4  # two writes each way went through; refusals journaled none


async def test_a_write_right_after_a_takeover_waits_out_the_old_holders_writes(open_journal: OpenJournal) -> None:
    """The shard's takeover fence: the door waits before sending, then sends only if the shard is
    still led here (refused, check `shard`, with the intent journaled, if it was lost meanwhile)."""
    journal = open_journal()
    journal.shard_terms.take(SHARD, SHARDS, "a")
    gate = Gate({SHARD}, fence_seconds=0.2)
    door = _door(journal, gate)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await _write(door) == "sent"
    assert loop.time() - began >= 0.2
    gate.fence_seconds, gate.lose_during_fence = 0.05, True
    with pytest.raises(Refused) as refused:
        await _write(door)
    assert refused.value.check == "shard" and "no longer leads" in refused.value.reason
    statuses = [r.status for r in journal.effects.of(TARGET)]
    assert statuses == ["intent", "done", "intent", "refused"]
