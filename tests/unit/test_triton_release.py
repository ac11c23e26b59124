"""The rollback's switch follows what the Triton release in use promises (issue 44), read from its
server metadata (`GET /v2`): the lab's Triton 2.51 as recorded, and 2.66.0 (the first release whose
docs drop the promise of a reload without loss of availability) as written from the documented
format, both in fixtures/triton_metadata/."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import pytest
from structlog.testing import capture_logs
from tritonclient.utils import InferenceServerException

from actions._triton_release import IN_PLACE, LOAD, release_version, switch_sequence
from actions.triton import TritonRollbackParams, plan_rollback
from actions.triton_warm import keep_warm, plan_warm
from core.signal import Signal, SignalSource
from core.target import Target
from actions.base import ActionDeps
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.workers.context import ActContext
from daemon.workers.state import ExecutorState
from daemon.workers.warm import WarmKeeper
from policies.loader import PolicySet, load_policies_text
from tests.support.fake_triton import FakeTriton, triton_metadata

MODEL = "ranker"
OLD, NEW = "http://old:8000", "http://new:8000"
TARGET = Target(MODEL, triton_endpoints=(OLD, NEW))
RECORDED, NEWER = triton_metadata("2.51.0"), triton_metadata("2.66.0")


def _replica(ready: list[int], server: dict[str, Any] | None, pinned: list[int] | None = None) -> dict[str, Any]:
    index = [{"name": MODEL, "version": str(v), "state": "READY" if v in ready else "UNAVAILABLE"} for v in (1, 2, 3)]
    policy = {"specific": {"versions": pinned}} if pinned else {"latest": {"num_versions": 1}}
    return {"index": index, "config": {"name": MODEL, "version_policy": policy}, "server": server}


# ---- pure: the decision from the metadata ---------------------------------------------------------------


def test_the_recorded_lab_triton_promises_the_in_place_reload_and_the_newer_release_does_not() -> None:
    assert (RECORDED["name"], RECORDED["version"]) == ("triton", "2.51.0")
    today = switch_sequence(RECORDED)
    assert (today.sequence, today.warm, today.release) == (IN_PLACE, True, "triton 2.51.0")
    newer = switch_sequence(NEWER)
    assert (newer.sequence, newer.warm, newer.release) == (LOAD, False, "triton 2.66.0")
    assert "unload" in newer.why and "never unloads a serving model" in newer.why


@pytest.mark.parametrize("version, sequence", [
    ("2.65.0", IN_PLACE), ("2.65.3", IN_PLACE), ("2.40.0", IN_PLACE), ("1.99", IN_PLACE),
    ("2.66.0", LOAD), ("2.66.0dev", LOAD), ("2.72.1", LOAD), ("3.0.0", LOAD),
    ("", LOAD), ("latest", LOAD),
])
def test_the_boundary_is_the_release_whose_docs_dropped_the_promise(version: str, sequence: str) -> None:
    assert switch_sequence({**RECORDED, "version": version}).sequence == sequence


def test_what_the_metadata_does_not_say_is_never_taken_as_a_promise() -> None:
    assert switch_sequence(None).sequence == LOAD and "could not be read" in switch_sequence(None).why
    assert switch_sequence({**RECORDED, "name": "other-server"}).sequence == LOAD
    assert switch_sequence({"name": "triton", "version": "2.51.0", "extensions": ["statistics"]}).sequence == LOAD
    assert switch_sequence({"name": "triton", "version": "2.51.0"}).sequence == LOAD  # no extensions at all
    assert release_version(RECORDED) == (2, 51, 0) and release_version({"version": "2.66"}) == (2, 66, 0)
    assert release_version({"version": "v2"}) is None and release_version(None) is None


# ---- the plans: the rollback's switch and the warm load, per replica's release ------------------------


def test_the_rollback_switches_in_place_only_on_the_release_that_promises_it() -> None:
    """Both replicas hold 2 warm beside 3: the 2.51 one is a warm switch; the 2.66 one gets today's load
    (the same single request, never an unload), and the step and its summary say why."""
    observed = {"replicas": {OLD: _replica([2, 3], RECORDED, [2, 3]), NEW: _replica([2, 3], NEWER, [2, 3])}}
    step = plan_rollback(TARGET, TritonRollbackParams.model_validate({"keepWarm": "previous"}), observed)
    assert step.after["version"] == 2
    assert step.after["replicas"] == {
        OLD: {"version": 2, "from": [2, 3], "switch": "warm", "release": "triton 2.51.0"},
        NEW: {"version": 2, "from": [2, 3], "switch": "load", "release": "triton 2.66.0"}}
    assert "warm switch on 1" in step.summary and "no warm switch on 1: triton 2.66.0" in step.summary
    unread = plan_rollback(TARGET, TritonRollbackParams(), {"replicas": {NEW: _replica([2, 3], None, [2, 3])}})
    assert unread.after["replicas"][NEW]["switch"] == "load" and "could not be read" in unread.summary


def test_no_version_is_kept_warm_on_a_release_that_does_not_promise_the_reload() -> None:
    observed = {"replicas": {OLD: _replica([3], RECORDED), NEW: _replica([3], NEWER)}, "known_bad": []}
    todo, skipped = plan_warm(MODEL, observed)
    assert list(todo) == [OLD] and todo[OLD]["versions"] == [2, 3]
    assert skipped[NEW].startswith("no version kept warm on triton 2.66.0")


# ---- through the action's own observe (an in-process Triton per release) ---------------------------------


async def test_observe_reads_each_replicas_release_and_the_warm_keeper_and_rollback_follow_it() -> None:
    triton = FakeTriton(MODEL, (OLD, NEW))
    triton.redeploy(3)
    triton.replicas[NEW].server = NEWER
    action = triton.action()(ActionDeps())
    params = TritonRollbackParams.model_validate({"keepWarm": "previous"})
    observed = await action.observe(TARGET, params)
    assert {u: r["server"]["version"] for u, r in observed["replicas"].items()} == {OLD: "2.51.0", NEW: "2.66.0"}

    warmed = await keep_warm(action, TARGET, params, {})
    assert warmed.ok and warmed.data["warmed"] == {OLD: 2} and NEW in warmed.data["skipped"], warmed.message
    assert [(load.url, load.versions) for load in triton.loads] == [(OLD, (2, 3))]  # nothing sent to NEW
    assert triton.served() == {OLD: [2, 3], NEW: [3]}

    signal = Signal(SignalSource.ALERT, "TailLatencyHigh", {}, datetime.now(timezone.utc), "k")
    step = action.plan(TARGET, params, await action.observe(TARGET, params), signal)
    assert {u: r["switch"] for u, r in step.after["replicas"].items()} == {OLD: "warm", NEW: "load"}
    applied = await action.apply(step, TARGET, params)
    assert applied.ok and triton.served() == {OLD: [2], NEW: [2]}, applied.message
    # One load each, the version-policy override: no unload on either release.
    assert [(load.url, load.versions) for load in triton.loads[1:]] in ([(OLD, (2,)), (NEW, (2,))],
                                                                      [(NEW, (2,)), (OLD, (2,))])

    triton.replicas[OLD].server = None  # metadata unreadable: no promise assumed, nothing kept warm
    triton.redeploy(3)
    assert (await keep_warm(action, TARGET, params, {})).status.value == "noop"


async def test_a_failed_reload_that_leaves_a_replica_serving_nothing_is_put_back() -> None:
    """From 2.66 Triton no longer promises that a failed reload leaves the model as it was. A replica
    left serving nothing is put back on its config with the replicas that moved: never left unloaded."""
    triton = FakeTriton(MODEL, (OLD, NEW))
    triton.redeploy(3)
    triton.replicas[NEW].server = NEWER
    fake_load = triton.load
    failing = {NEW}

    def load(url: str, config: Mapping[str, Any]) -> None:
        if url in failing:
            failing.clear()  # the first load fails and takes the model down; the put-back loads
            triton.replicas[url].served = []
            raise InferenceServerException(msg="failed to load 'ranker' version 2: out of memory", status="400")
        fake_load(url, config)

    triton.load = load  # type: ignore[method-assign]
    action = triton.action()(ActionDeps())
    signal = Signal(SignalSource.ALERT, "TailLatencyHigh", {}, datetime.now(timezone.utc), "k")
    step = action.plan(TARGET, TritonRollbackParams(), await action.observe(TARGET, TritonRollbackParams()), signal)
    applied = await action.apply(step, TARGET, TritonRollbackParams())
    assert applied.status.value == "failed" and applied.retryable, applied.message
    assert applied.data["put_back"] == sorted([OLD, NEW]) and applied.data["not_put_back"] == {}
    assert "left serving nothing" in applied.message
    assert triton.served() == {OLD: [3], NEW: [3]}


async def test_the_warm_keeper_loads_nothing_on_the_newer_release_and_says_so_once(tmp_path: Path) -> None:
    triton = FakeTriton(MODEL, (OLD, NEW))
    triton.redeploy(3)
    for rep in triton.replicas.values():
        rep.server = NEWER
    registry: dict[str, Any] = {"triton.rollback": triton.action()}
    policy = (f"name: rollback\ntarget: {{model: {MODEL}, triton: {{endpoints: ['{OLD}', '{NEW}']}}}}\n"
              "triggers:\n  - alert: {name: TailLatencyHigh, actsUngoverned: true}\n"
              "actions:\n  - {type: triton.rollback, keepWarm: previous}\n"
              "verify: {query: up, below: 1, onNotRecovered: none}\n")
    state = ExecutorState(PolicySet(load_policies_text(policy, "p.yaml", registry, {}).policies))
    journal = Journal(tmp_path / "journal.db")
    try:
        keeper = WarmKeeper(ActContext(journal, state, ActionDeps(), Metrics(), registry))
        with capture_logs() as logs:
            for _ in range(3):
                out = (await keeper.once())[TARGET.key]
                assert out.status.value == "noop" and set(out.data["skipped"]) == {OLD, NEW}, out.message
        assert triton.loads == []
        said = [e for e in logs if e["event"].startswith("no version kept warm")]
        assert len(said) == 1 and "triton 2.66.0" in said[0]["reason"]
    finally:
        journal.close()
