"""The door (daemon/workers/door.py): every write asks freezes, leadership, the fence term and bad
marks at the moment of the write, and is journaled (intent, then result; or one refusal row).

The reproductions of issue 42 (each failed before the door: the pin reconciler checked only the
settings file's freeze and planned without the bad marks, the recovery revert only leadership):
a whole-daemon runtime freeze stops the pin reconciler; a pin to a version an operator marked bad is
refused and journaled; the recovery revert is refused under a runtime freeze. And behaviour: every
Triton load the executor, the pin reconciler and the reverts make is sent from inside the door.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from actions.base import ActionDeps, Effect, Refused
from core.signal import Signal, SignalSource
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE, EffectRow
from daemon.workers.context import ActContext
from daemon.workers.door import EXECUTOR, PINS, REVERT, acting
from daemon.workers.executor import Executor
from daemon.workers.freezes import FreezeControl
from daemon.workers.pins import PinReconciler
from daemon.workers.state import ExecutorState
from policies.loader import PolicySet, load_policies_text
from tests.support.fake_triton import CountingDoor, FakeTriton

MODEL = "ranker"
KEY = f"default/{MODEL}"
URLS = ("http://a:8000", "http://b:8000")


def _policy(verify: str = "{query: up, below: 1, onNotRecovered: none}") -> str:
    endpoints = ", ".join(f"'{u}'" for u in URLS)
    return (f"name: rollback\ntarget: {{model: {MODEL}, triton: {{endpoints: [{endpoints}]}}}}\n"
            "triggers:\n  - alert: {name: TailLatencyHigh, actsUngoverned: true}\nactions:\n  - {type: triton.rollback}\n"
            f"verify: {verify}\n")


class World:
    """A journal, a fake Triton, the door on them, and the workers that write through it."""

    def __init__(self, tmp_path: Path, verify: str | None = None) -> None:
        self.now = 1_000_000.0
        self.journal = Journal(tmp_path / "journal.db", clock=lambda: self.now)  # pins and effects stamped on it
        self.triton = FakeTriton(MODEL, URLS)
        self.registry: dict[str, Any] = {"triton.rollback": self.triton.action()}
        policies = load_policies_text(_policy(verify) if verify else _policy(), "p.yaml", self.registry, {})
        self.state = ExecutorState(PolicySet(policies.policies))
        self.metrics = Metrics()
        self.leader = True
        self.deps = ActionDeps()
        self.door = CountingDoor(self.journal, self.state, self.deps, lambda: self.leader, self.metrics,
                                 clock=lambda: self.now)
        self.deps.actuator = self.door
        self.freezes = FreezeControl(self.journal, Metrics(), False, clock=lambda: self.now)
        self.announced: list[dict[str, Any]] = []
        self.k8s_events: list[tuple[str, str]] = []

        async def record_event(*, policy: Any, reason: str, message: str, warning: bool) -> None:
            self.k8s_events.append((reason, message))

        self.deps.record_event = record_event
        self.ctx = ActContext(self.journal, self.state, self.deps, self.metrics, self.registry,
                              may_act=lambda: self.leader, notify=self.announced.append)
        self.lock_for = self.ctx.lock_for
        self.pins = PinReconciler(self.ctx, repin_escalate_after=3, repin_window_seconds=3600)

    def effects(self, **kw: Any) -> list[EffectRow]:
        return self.journal.effects.of(KEY, **kw)

    def close(self) -> None:
        self.journal.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


# ---- the door's checks ---------------------------------------------------------------------------

async def _send_ok() -> str:
    return "sent"


async def test_a_write_with_no_declared_writer_is_refused_and_never_sent(world: World) -> None:
    sent: list[int] = []

    async def send() -> None:
        sent.append(1)

    with pytest.raises(Refused) as refused:
        await world.door.write(Effect("triton.load", "load v1", loads=1), send)
    assert refused.value.check == "writer" and not refused.value.retryable and sent == []


@pytest.mark.parametrize("scope", [DAEMON_SCOPE, KEY])
async def test_a_runtime_freeze_of_the_daemon_or_the_target_refuses_every_writer(world: World, scope: str) -> None:
    """Set through the API/CLI path (FreezeControl): the door refuses the executor, the pin
    reconciler and the revert alike, journals the refusal, and sends nothing."""
    await world.freezes.freeze(scope, "incident 42", "alice", "api")
    for writer in (EXECUTOR, PINS, REVERT):
        with acting(writer, KEY, 7 if writer != PINS else None):
            with pytest.raises(Refused) as refused:
                await world.door.write(Effect("kube.patch", "patch weights"), _send_ok)
        assert refused.value.check == "freeze" and "incident 42" in refused.value.reason
    rows = world.effects()
    assert [(r.writer, r.status, r.data["check"]) for r in rows] == [
        (EXECUTOR, "refused", "freeze"), (PINS, "refused", "freeze"), (REVERT, "refused", "freeze")]
    assert world.door.sent == 0


async def test_an_escalation_freeze_and_the_settings_freeze_refuse_too(world: World) -> None:
    world.journal.freezes.record(KEY, "policy p, decision 3: not_recovered", world.now + 60, 3)
    with acting(PINS, KEY), pytest.raises(Refused, match="decision 3"):
        await world.door.write(Effect("triton.load", "load v1", loads=1), _send_ok)
    world.now += 120  # the escalation expired
    with acting(PINS, KEY):
        assert await world.door.write(Effect("triton.load", "load v1", loads=1), _send_ok) == "sent"
    world.state.frozen = True
    with acting(PINS, KEY), pytest.raises(Refused, match="settings file"):
        await world.door.write(Effect("triton.load", "load v1", loads=1), _send_ok)


async def test_a_replica_that_may_not_act_or_was_fenced_writes_nothing(world: World) -> None:
    world.leader = False
    with acting(EXECUTOR, KEY, 1), pytest.raises(Refused) as refused:
        await world.door.write(Effect("triton.load", "load v1", loads=1), _send_ok)
    assert refused.value.check == "leader"
    world.leader = True
    # This replica took term 1; another took term 2 since: the fenced intent is refused by the journal.
    world.journal.terms.take("replica-a")
    other = Journal(world.journal._db.path if hasattr(world.journal._db, "path") else ":memory:")
    try:
        other.terms.take("replica-b")
    finally:
        other.close()
    with acting(EXECUTOR, KEY, 1), pytest.raises(Refused) as fenced:
        await world.door.write(Effect("triton.load", "load v1", loads=1), _send_ok)
    assert fenced.value.check == "fence" and world.door.sent == 0


async def test_the_write_fence_is_asked_right_before_the_request(world: World) -> None:
    asked: list[float] = []

    async def fence(timeout: float) -> str | None:
        asked.append(timeout)
        return "this replica no longer holds the Lease"

    world.deps.write_fence = fence
    with acting(PINS, KEY), pytest.raises(Refused) as refused:
        await world.door.write(Effect("triton.load", "load v1", loads=1, timeout_seconds=12.0), _send_ok)
    assert refused.value.check == "fence" and asked == [12.0]
    # The intent was journaled (fenced write, the term held), then the refusal naming it.
    intent, refusal = world.effects()
    assert (intent.status, refusal.status) == ("intent", "refused")
    assert refusal.data["intent"] == intent.id


async def test_a_load_of_a_version_marked_bad_is_refused_except_a_revert_of_its_own_decision(world: World) -> None:
    world.journal.bad_versions.mark(KEY, 2, "rolled back to 1 by decision 5", decision_id=5)
    with acting(EXECUTOR, KEY, 9), pytest.raises(Refused) as refused:
        await world.door.write(Effect("triton.load", "load v2", loads=2), _send_ok)
    assert refused.value.check == "bad_version" and "--clear 2" in refused.value.reason
    with acting(REVERT, KEY, 6), pytest.raises(Refused):
        await world.door.write(Effect("triton.load", "load v2", loads=2), _send_ok)  # another decision's mark
    with acting(REVERT, KEY, 5):
        assert await world.door.write(Effect("triton.load", "load v2", loads=2), _send_ok) == "sent"
    with acting(EXECUTOR, KEY, 9):
        assert await world.door.write(Effect("triton.load", "load v1", loads=1), _send_ok) == "sent"


async def test_each_write_is_journaled_intent_then_result_and_a_failure_is_re_raised(world: World) -> None:
    async def boom() -> None:
        raise ConnectionResetError("reset by peer")

    with acting(EXECUTOR, KEY, 4):
        await world.door.write(Effect("kube.patch", "patch weights", data={"ops": 2}), _send_ok)
        with pytest.raises(ConnectionResetError):
            await world.door.write(Effect("kube.patch", "patch weights"), boom)
    rows = world.effects()
    assert [(r.status, r.decision_id, r.writer) for r in rows] == [
        ("intent", 4, EXECUTOR), ("done", 4, EXECUTOR), ("intent", 4, EXECUTOR), ("failed", 4, EXECUTOR)]
    assert rows[1].data["intent"] == rows[0].id and "reset by peer" in rows[3].message
    sample = world.metrics.registry.get_sample_value
    assert sample("tailguard_door_writes_total", {"writer": EXECUTOR, "kind": "kube.patch", "result": "sent"}) == 1
    assert sample("tailguard_door_writes_total", {"writer": EXECUTOR, "kind": "kube.patch", "result": "failed"}) == 1


# ---- reproductions ---------------------------------------------------------------------------------

async def test_a_daemon_frozen_through_the_api_does_not_re_pin(world: World) -> None:
    """Issue 42 (a): rolled back v2 -> v1 (the pin, v2 marked bad), the whole daemon frozen through the
    runtime freeze, v2 redeployed by hand: the next pin pass does not load v1; journaled once."""
    world.journal.pins.record(KEY, MODEL, 1, from_version=2, decision_id=None, policy="rollback")
    await world.freezes.freeze(DAEMON_SCOPE, "hands off: incident 42", "alice", "api")
    world.triton.redeploy(2)

    first = (await world.pins.reconcile_once())[KEY]
    second = (await world.pins.reconcile_once())[KEY]

    assert world.triton.loads == [] and world.triton.served() == {u: [2] for u in URLS}
    assert first.status.value == "skipped" and "daemon frozen" in first.message and first.data["refused"] == "freeze"
    assert second.status.value == "skipped"
    (refused,) = world.effects()  # journaled once, not every pass
    assert (refused.writer, refused.status, refused.data["check"]) == (PINS, "refused", "freeze")
    sample = world.metrics.registry.get_sample_value
    assert sample("tailguard_actions_total", {"action": "pin.reconcile", "result": "refused"}) == 2

    await world.freezes.unfreeze(DAEMON_SCOPE, "over", "alice", "api")
    lifted = (await world.pins.reconcile_once())[KEY]
    assert lifted.ok and world.triton.served() == {u: [1] for u in URLS}


async def test_a_pin_to_a_version_an_operator_marked_bad_is_refused_and_journaled(world: World) -> None:
    """Issue 42 (b): the pin says v1, an operator marked v1 bad: no load, a journaled refusal."""
    world.journal.pins.record(KEY, MODEL, 1, from_version=2, policy="rollback")
    world.journal.bad_versions.mark(KEY, 1, "operator: v1 corrupts embeddings")
    world.triton.redeploy(2)

    outcome = (await world.pins.reconcile_once())[KEY]

    assert world.triton.loads == [] and outcome.status.value == "skipped"
    assert outcome.data["refused"] == "bad_version" and "version 1 is marked bad" in outcome.message
    (refused,) = world.effects()
    assert refused.status == "refused" and refused.data == {"check": "bad_version", "loads": 1}


async def test_the_recovery_revert_is_refused_under_a_runtime_freeze(tmp_path: Path) -> None:
    """Issue 42 (c): a rollback v2 -> v1 that did not recover, with onNotRecovered: revert; the daemon
    is frozen through the runtime freeze while the check runs: the revert loads nothing, the
    decision ends failed naming the refusal, and the pin stays."""
    w = World(tmp_path, verify="{query: 'p999', below: 500, for: 2s, within: 8s, interval: 1s, "
                               "onNotRecovered: revert}")
    try:
        froze: list[bool] = []

        async def sleep(delay: float) -> None:
            w.now += delay
            if not froze:
                froze.append(True)
                await w.freezes.freeze(DAEMON_SCOPE, "hands off: incident 42", "alice", "api")

        async def prometheus(promql: str) -> Any:
            from core.query import QueryResult, Sample
            return QueryResult(promql, (Sample({"model": MODEL}, 900.0),))

        w.deps.query = prometheus
        executor = Executor(ActContext(w.journal, w.state, w.deps, w.metrics, w.registry, clock=lambda: w.now,
                                       sleep=sleep, notify=w.announced.append))
        signal = Signal(SignalSource.ALERT, "TailLatencyHigh", {"model": MODEL}, datetime.now(timezone.utc), "a1")
        ((signal_id, stored),), _ = await w.journal.signals.intake([signal])
        await executor.process(signal_id, stored)
        assert w.triton.served() == {u: [1] for u in URLS}
        await executor.wait_recoveries()
        await executor.close()

        assert w.triton.served() == {u: [1] for u in URLS}  # the rollback stands
        assert [ld.versions for ld in w.triton.loads] == [(1,), (1,)]  # the rollback's loads, no revert
        (decision,) = w.journal.decisions.all()
        assert decision.state == "failed" and "revert failed" in decision.reason
        reverts = [r for r in w.effects() if r.writer == REVERT]
        assert reverts and all(r.status == "refused" and r.data["check"] == "freeze" for r in reverts)
        assert [p.version for p in w.journal.pins.live()] == [1]
        assert all(ld.through_door for ld in w.triton.loads)
    finally:
        w.close()


# ---- no silent tug of war ---------------------------------------------------------------------------

async def test_a_redeployed_rolled_back_version_is_re_pinned_announced_once_then_escalates(world: World) -> None:
    """The pipeline redeploys v2 (rolled back from, marked bad) again and again: each re-pin is
    journaled and counted, the first one per version announced (an Event and a notification); past
    repinEscalateAfter=3 re-pins in the window the target escalates and re-pinning waits: nothing is
    loaded until an operator clears the mark (the pin then ends, not fought) or unpins."""
    world.journal.pins.record(KEY, MODEL, 1, from_version=2, policy="rollback")
    for _ in range(3):
        world.triton.redeploy(2)
        assert (await world.pins.reconcile_once())[KEY].ok
        assert world.triton.served() == {u: [1] for u in URLS}
    assert [r.status for r in world.effects(kind="pin.repin")] == ["done"] * 3
    assert [reason for reason, _ in world.k8s_events] == ["PinTugOfWar"]  # once per version
    assert [e["event"] for e in world.announced] == ["acted"] and world.announced[0]["version"] == 2
    sample = world.metrics.registry.get_sample_value
    assert sample("tailguard_pin_repins_total", {"target": KEY}) == 3

    world.triton.redeploy(2)
    loads = len(world.triton.loads)
    held = (await world.pins.reconcile_once())[KEY]
    assert held.status.value == "skipped" and held.data["held"] and "waits for an operator" in held.message
    assert len(world.triton.loads) == loads and world.triton.served() == {u: [2] for u in URLS}
    (escalated,) = world.effects(kind="pin.escalated")
    assert escalated.data["repins"] == 3 and "--clear 2" in escalated.message
    assert [reason for reason, _ in world.k8s_events] == ["PinTugOfWar", "PinTugOfWarEscalated"]
    assert [e["event"] for e in world.announced] == ["acted", "escalated"]

    world.now += 7200  # the window passed: still held, the operator has not answered
    again = (await world.pins.reconcile_once())[KEY]
    assert again.status.value == "skipped" and len(world.triton.loads) == loads
    assert len(world.announced) == 2 and len(world.effects(kind="pin.escalated")) == 1

    world.journal.bad_versions.clear(KEY, 2, "v2 fixed in the pipeline")
    ended = (await world.pins.reconcile_once())[KEY]
    assert ended.data["ended"] and world.journal.pins.live() == [] and len(world.triton.loads) == loads
    assert "no longer marked bad" in world.journal.pins.ended()[0].ended_reason


async def test_an_unpin_answers_an_escalated_tug_of_war_and_a_new_pin_starts_afresh(world: World) -> None:
    world.journal.pins.record(KEY, MODEL, 1, from_version=2, policy="rollback")
    pins = PinReconciler(replace(world.ctx, metrics=Metrics(), may_act=lambda: True), repin_escalate_after=1)
    world.triton.redeploy(2)
    assert (await pins.reconcile_once())[KEY].ok
    world.triton.redeploy(2)
    assert (await pins.reconcile_once())[KEY].data["held"]
    world.journal.pins.end(KEY, "unpinned by alice")  # `tailguard unpin`
    assert await pins.reconcile_once() == {}
    world.now += 1
    world.journal.pins.record(KEY, MODEL, 1, from_version=2, policy="rollback")  # a later rollback's pin
    assert (await pins.reconcile_once())[KEY].ok and world.triton.served() == {u: [1] for u in URLS}


async def test_a_re_pin_of_a_replica_that_merely_restarted_is_not_a_tug_of_war(world: World) -> None:
    """A pod that restarts loads the newest version it has (v3 here, not the rolled-back v2): re-pinned
    as before, with no tug-of-war count or announcement."""
    world.journal.pins.record(KEY, MODEL, 2, from_version=3, policy="rollback")
    world.triton.redeploy(2)  # every replica on v2 (the pin)
    world.triton.replicas[URLS[0]].repository = (1, 2)
    world.triton.replicas[URLS[0]].served = [1]  # a replica that came back on an older version
    assert (await world.pins.reconcile_once())[KEY].ok
    assert world.effects(kind="pin.repin") == [] and world.announced == []


async def test_re_pins_spread_wider_than_the_window_do_not_escalate(world: World) -> None:
    """Three re-pins, then the window (3600 s) passes: the fourth is a re-pin again, not an escalation."""
    world.journal.pins.record(KEY, MODEL, 1, from_version=2, policy="rollback")
    for _ in range(3):
        world.triton.redeploy(2)
        assert (await world.pins.reconcile_once())[KEY].ok
    world.now += 3601
    world.triton.redeploy(2)
    assert (await world.pins.reconcile_once())[KEY].ok
    assert world.effects(kind="pin.escalated") == [] and len(world.effects(kind="pin.repin")) == 4


async def test_a_journal_that_cannot_be_read_refuses_the_write_retryably(world: World) -> None:
    """The checks cannot be read (the journal is gone): nothing is sent; the refusal is typed and
    retryable (a journal outage passes), never a crash of the caller."""
    world.journal.close()
    with acting(EXECUTOR, KEY, 1), pytest.raises(Refused) as refused:
        await world.door.write(Effect("triton.load", "load v1", loads=1), _send_ok)
    assert refused.value.check == "journal" and refused.value.retryable and world.door.sent == 0
    with acting(PINS, KEY):
        asked = await world.door.ask(Effect("triton.load", "load v1", loads=1))
    assert asked is not None and asked.check == "journal"
