"""keepWarm (issue 44): the previous good version kept loaded beside the served one, so that the
rollback is a switch (a config update of a loaded version) and not a load.

Pure planning of the warm load and of the rollback's switch; the pin reconciler's acceptance of a
warm set; and the warm keeper over an in-process Triton behind the daemon's real door (freezes, bad
marks, pinned targets left alone, a failed load not retried every pass)."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import pytest

from actions.base import ActionDeps
from actions._triton_versions import is_warm_set
from actions.triton import TritonRollback, TritonRollbackParams, plan_rollback
from actions.triton_warm import plan_warm, warm_version
from core.signal import Signal, SignalSource
from core.target import Target
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.storage.records import DAEMON_SCOPE, EffectRow
from daemon.workers.freezes import FreezeControl
from daemon.workers.context import ActContext
from daemon.workers.pins import PinReconciler
from daemon.workers.state import ExecutorState
from policies.loader import PolicySet, load_policies_text
from tests.support.fake_triton import CountingDoor, FakeTriton

MODEL = "ranker"
KEY = f"default/{MODEL}"
URLS = ("http://a:8000", "http://b:8000")
TARGET = Target(MODEL, triton_endpoints=URLS)


def _replica(ready: list[int], pinned: list[int] | None = None, listed: tuple[int, ...] = (1, 2, 3)
             ) -> dict[str, Any]:
    index = [{"name": MODEL, "version": str(v), "state": "READY" if v in ready else "UNAVAILABLE"} for v in listed]
    policy = {"specific": {"versions": pinned}} if pinned else {"latest": {"num_versions": 1}}
    return {"index": index, "config": {"name": MODEL, "backend": "python", "version_policy": policy}}


# ---- pure: what to keep warm, and the rollback's switch ------------------------------------------------


def test_the_warm_version_is_the_newest_good_one_below_the_served_one() -> None:
    assert warm_version([3], [1, 2, 3], frozenset()) == (2, "previous of served version 3 (known versions [1, 2, 3])")
    assert warm_version([3], [1, 2, 3], frozenset({2}))[0] == 1  # a bad mark is skipped
    assert warm_version([1], [1], frozenset()) == (None, "served version 1 has no earlier good version")
    assert warm_version([], [1, 2], frozenset()) == (None, "serves no READY version")


def test_plan_warm_loads_the_previous_version_beside_the_served_one_and_never_drops_a_version() -> None:
    observed = {"replicas": {"http://a:8000": _replica([3]), "http://b:8000": _replica([2, 3], [2, 3]),
                             "http://c:8000": _replica([1], listed=(1,))},
                "known_bad": []}
    todo, skipped = plan_warm(MODEL, observed)
    assert list(todo) == ["http://a:8000"]
    load = todo["http://a:8000"]
    assert (load["warm"], load["serving"], load["versions"]) == (2, 3, [2, 3])
    # The replica's own config, only its version policy changed: Triton updates, never reloads, a loaded version.
    assert load["config"] == {"name": MODEL, "backend": "python", "version_policy": {"specific": {"versions": [2, 3]}}}
    assert skipped == {"http://b:8000": "version 2 is warm beside 3",
                       "http://c:8000": "served version 1 has no earlier good version"}
    # A version whose load failed on that replica is not tried again while it would be the same one.
    todo, skipped = plan_warm(MODEL, observed, failed={"http://a:8000": 2})
    assert todo == {} and "failed before" in skipped["http://a:8000"]
    assert list(plan_warm(MODEL, observed, failed={"http://a:8000": 1})[0]) == ["http://a:8000"]


def test_the_rollback_plans_a_warm_switch_where_the_previous_version_is_loaded_and_a_load_elsewhere() -> None:
    """Same request either way (a load naming only N-1); the step says which it is: with N-1 warm it is a
    config update of a loaded version, without it today's load (the fallback)."""
    params = TritonRollbackParams.model_validate({"keepWarm": "previous"})
    observed = {"replicas": {"http://a:8000": _replica([2, 3], [2, 3]), "http://b:8000": _replica([3])}}
    step = plan_rollback(TARGET, params, observed)
    assert step.after["version"] == 2
    assert step.after["replicas"] == {"http://a:8000": {"version": 2, "from": [2, 3], "switch": "warm"},
                                      "http://b:8000": {"version": 2, "from": [3], "switch": "load"}}
    assert "warm switch on 1: version 2 already loaded" in step.summary
    cold = plan_rollback(TARGET, TritonRollbackParams(), {"replicas": {"http://b:8000": _replica([3])}})
    assert "warm switch" not in cold.summary and cold.after["replicas"]["http://b:8000"]["switch"] == "load"


def test_keep_warm_is_a_strict_param() -> None:
    assert TritonRollbackParams().keep_warm == "none"
    with pytest.raises(ValueError):
        TritonRollbackParams.model_validate({"keepWarm": "two"})


def test_the_pin_reconciler_accepts_a_warm_set_below_the_pinned_version_only() -> None:
    action = TritonRollback(ActionDeps())
    params = action.pin_params(2)
    warm = action.plan_pin(TARGET, params, {"replicas": {"http://a:8000": _replica([1, 2], [1, 2])}})
    assert warm.step.noop and warm.drifted == {}
    # The bad version kept "warm" above the pin is drift: unversioned requests would go to it.
    above = action.plan_pin(TARGET, action.pin_params(1), {"replicas": {"http://a:8000": _replica([1, 2], [1, 2])}})
    assert not above.step.noop and above.drifted == {"http://a:8000": [1, 2]}
    # A warm version marked bad is drift too; so is a warm set the config does not pin.
    marked = action.plan_pin(TARGET, params, {"replicas": {"http://a:8000": _replica([1, 2], [1, 2])},
                                              "known_bad": [1]})
    assert not marked.step.noop
    assert is_warm_set([1, 2], 2) and not is_warm_set([1, 2], 1) and not is_warm_set([1, 2, 3], 3)
    # The executor's rollback (not the pin) still wants the version alone.
    plain = plan_rollback(TARGET, TritonRollbackParams(to=2), {"replicas": {"http://a:8000": _replica([1, 2], [1, 2])}})
    assert not plain.noop


# ---- the warm keeper, through the daemon's door -------------------------------------------------------


def _policy(keep_warm: str = "previous") -> str:
    endpoints = ", ".join(f"'{u}'" for u in URLS)
    return (f"name: rollback\ntarget: {{model: {MODEL}, triton: {{endpoints: [{endpoints}]}}}}\n"
            "triggers:\n  - alert: {name: TailLatencyHigh, actsUngoverned: true}\n"
            f"actions:\n  - {{type: triton.rollback, keepWarm: {keep_warm}}}\n"
            "verify: {query: up, below: 1, onNotRecovered: none}\n")


class World:
    def __init__(self, tmp_path: Path, keep_warm: str = "previous") -> None:
        self.now = 1_000_000.0
        self.journal = Journal(tmp_path / "journal.db", clock=lambda: self.now)
        self.triton = FakeTriton(MODEL, URLS)
        self.registry: dict[str, Any] = {"triton.rollback": self.triton.action()}
        policies = load_policies_text(_policy(keep_warm), "p.yaml", self.registry, {})
        self.state = ExecutorState(PolicySet(policies.policies))
        self.metrics = Metrics()
        self.deps = ActionDeps()
        self.door = CountingDoor(self.journal, self.state, self.deps, lambda: True, self.metrics,
                                 clock=lambda: self.now)
        self.deps.actuator = self.door
        self.freezes = FreezeControl(self.journal, Metrics(), False, clock=lambda: self.now)
        self.pins = PinReconciler(ActContext(self.journal, self.state, self.deps, self.metrics, self.registry))

    def effects(self) -> list[EffectRow]:
        return self.journal.effects.of(KEY)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    yield w
    w.journal.close()


async def test_after_a_deploy_every_replica_gets_the_previous_version_warm_through_the_door(world: World) -> None:
    world.triton.redeploy(3)  # serves 3 alone (latest), 1 and 2 in the repository
    out = (await world.pins.warm.once())[KEY]
    assert out.ok and out.data["warmed"] == {u: 2 for u in URLS}, out.message
    assert world.triton.served() == {u: [2, 3] for u in URLS}
    assert all(load.through_door and load.versions == (2, 3) for load in world.triton.loads)
    intents = [e for e in world.effects() if e.status == "intent"]
    assert [(e.writer, e.data["loads"]) for e in intents] == [("warm", 2), ("warm", 2)]
    assert [e.status for e in world.effects()].count("done") == 2
    # In place: the next pass loads nothing.
    assert (await world.pins.warm.once())[KEY].status.value == "noop" and len(world.triton.loads) == 2

    # The rollback is then the warm switch on every replica, planned and applied as one load each.
    action = world.triton.action()(world.deps)
    params = TritonRollbackParams.model_validate({"keepWarm": "previous"})
    signal = Signal(SignalSource.ALERT, "TailLatencyHigh", {}, datetime.now(timezone.utc), "k")
    step = action.plan(TARGET, params, await action.observe(TARGET, params), signal)
    assert {r["switch"] for r in step.after["replicas"].values()} == {"warm"}


async def test_a_freeze_refuses_the_warm_load_and_nothing_is_sent(world: World) -> None:
    world.triton.redeploy(3)
    await world.freezes.freeze(DAEMON_SCOPE, "incident 44", "alice", "api")
    for _ in range(2):
        out = (await world.pins.warm.once())[KEY]
        assert out.status.value == "skipped" and out.data["refused"] == "freeze", out.message
    assert world.triton.loads == [] and world.door.sent == 0


async def test_a_warm_version_marked_bad_is_not_loaded(world: World) -> None:
    """Planned around (the marks lent to actions), and refused by the door when planning missed it."""
    world.triton.redeploy(3)
    world.journal.bad_versions.mark(KEY, 2, "slow in incident 40")
    refused = (await world.pins.warm.once())[KEY]  # no marks lent: the door is the last word
    assert refused.status.value == "skipped" and refused.data["refused"] == "bad_version" and not world.triton.loads

    async def known_bad(key: str) -> frozenset[int]:
        return frozenset(await world.journal.bad_versions.known.in_thread(key))

    world.deps.known_bad = known_bad
    out = (await world.pins.warm.once())[KEY]
    assert out.ok and out.data["warmed"] == {u: 1 for u in URLS}  # the newest good one below 3
    assert world.triton.served() == {u: [1, 3] for u in URLS}


async def test_a_pinned_target_is_not_warmed_and_no_policy_without_keep_warm_is(tmp_path: Path) -> None:
    world = World(tmp_path)
    try:
        world.triton.redeploy(3)
        world.journal.pins.record(KEY, MODEL, 3, policy="rollback")
        assert await world.pins.warm.once() == {} and world.triton.loads == []
    finally:
        world.journal.close()
    plain = World(tmp_path / "plain", keep_warm="none")
    try:
        plain.triton.redeploy(3)
        assert await plain.pins.warm.once() == {} and plain.triton.loads == []
    finally:
        plain.journal.close()


async def test_a_warm_load_that_fails_leaves_the_replica_serving_and_is_not_retried_every_pass(
        world: World) -> None:
    world.triton.redeploy(3)
    tries: list[str] = []
    fake_load = world.triton.load

    def missing(url: str, config: Mapping[str, Any]) -> None:
        tries.append(url)
        if url == URLS[0]:
            from tritonclient.utils import InferenceServerException
            raise InferenceServerException("failed to load 'ranker' version 2: not found")
        fake_load(url, config)

    world.triton.load = missing  # type: ignore[method-assign]
    out = (await world.pins.warm.once())[KEY]
    assert out.status.value == "failed" and out.data["warmed"] == {URLS[1]: 2} and URLS[0] in out.data["errors"]
    assert world.triton.served() == {URLS[0]: [3], URLS[1]: [2, 3]}
    again = (await world.pins.warm.once())[KEY]
    assert again.status.value == "noop" and tries == [URLS[0], URLS[1]]
    failed = [e for e in world.effects() if e.status == "failed"]
    assert len(failed) == 1 and "not found" in failed[0].message


async def test_the_pin_reconciler_moves_a_drifted_replica_and_leaves_a_warm_set_in_place(world: World) -> None:
    """Pinned to 2: a replica serving 2 with 1 warm beside it is in sync; a pod that started later on
    3 is re-pinned to 2 alone; the warm replica is not loaded again (no tug of war with the keeper)."""
    a, b = URLS
    for rep in world.triton.replicas.values():
        rep.repository = (1, 2, 3)
    world.triton.replicas[a].served, world.triton.replicas[a].policy = [1, 2], {"specific": {"versions": [1, 2]}}
    world.triton.replicas[b].served = [3]
    world.journal.pins.record(KEY, MODEL, 2, policy="rollback")
    out = (await world.pins.reconcile_once())[KEY]
    assert out.ok and out.data["drifted"] == {b: [3]}, out.message
    assert world.triton.served() == {a: [1, 2], b: [2]}
    assert [(load.url, load.versions) for load in world.triton.loads] == [(b, (2,))]
    assert (await world.pins.reconcile_once())[KEY].status.value == "noop"


async def test_a_target_of_a_shard_led_elsewhere_is_not_warmed(world: World) -> None:
    world.triton.redeploy(3)
    world.pins.owns = lambda key: key != KEY
    assert await world.pins.warm.once() == {} and world.triton.loads == []
    world.pins.owns = lambda key: True
    assert (await world.pins.warm.once())[KEY].ok
