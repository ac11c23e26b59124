"""keepWarm on the real Triton (issue 44): after a deploy the warm keeper loads the previous version P
beside the served N through the door; the rollback is then a switch (a config update of the loaded P,
no new Python-backend stub started, well under a second) and P serves alone. After it the pin holds
with no load: Triton still reports P's config as loaded (`[P, N]`), which the pin check and a second
rollback read as pinned to P (actions/_triton_versions.py `pin_in_force`)."""
from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from actions.base import ActionDeps
from actions.triton import TritonRollbackParams
from core.signal import Signal, SignalSource
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.door import EXECUTOR, Door, acting
from daemon.workers.context import ActContext
from daemon.workers.pins import PinReconciler
from daemon.workers.state import ExecutorState
from lab.triton import served_versions
from policies.loader import PolicySet, load_policies_text

pytestmark = pytest.mark.integration

POLICY = """
name: ranker-tail
target:
  model: ranker
  triton: {endpoints: ['URL']}
triggers:
  - alert: {name: TritonTailLatencyHigh, actsUngoverned: true}
actions:
  - {type: triton.rollback, keepWarm: previous}
verify: {query: 'vector(0)', below: 1, onNotRecovered: none}
"""


def _stubs(pid: int) -> set[int]:
    """Triton's child processes (its Python-backend stubs)."""
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found |= {int(c) for c in f.read().split()}
    return found


async def _served_by(base_url: str) -> str:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base_url}/v2/models/ranker/infer", json=body) as response:
            assert response.status == 200
            return str((await response.json())["model_version"])


# newest 2: the rollback lands on the oldest version (nothing below it to keep warm);
# newest 3: version 1 lies below the rollback target (a second rollback must not walk to it).
@pytest.mark.parametrize("newest", [2, 3])
async def test_keep_warm_loads_the_previous_beside_the_served_and_the_rollback_switches_without_a_load(
        tmp_path: Path, triton_factory: Any, newest: int) -> None:
    # precompile: a production repository does not change under a loaded version (lab/triton.py).
    fractions = {v: 0.0 for v in range(1, newest + 1)}
    triton = await triton_factory(name="ranker", precompile=True, slow_fraction_by_version=fractions)
    prev = newest - 1
    assert await asyncio.to_thread(served_versions, triton) == [str(newest)]
    journal = Journal(tmp_path / "journal.db")
    policies = load_policies_text(POLICY.replace("URL", triton.base_url), "p.yaml", action_registry(),
                                  detector_registry())
    state = ExecutorState(PolicySet(policies.policies))
    metrics = Metrics()
    deps = ActionDeps(known_bad=journal.bad_versions.known.in_thread)
    deps.actuator = Door(journal, state, deps, lambda: True, metrics)
    reconciler = PinReconciler(ActContext(journal, state, deps, metrics, action_registry()))
    policy = policies.policies[0]
    key = policy.target.key
    try:
        warmed = (await reconciler.warm.once())[key]
        assert warmed.ok and set(warmed.data["warmed"].values()) == {prev}, warmed.message
        assert await asyncio.to_thread(served_versions, triton) == [str(prev), str(newest)]
        assert await _served_by(triton.base_url) == str(newest)  # unversioned requests go to the newest
        assert (await reconciler.warm.once())[key].status.value == "noop"
        intents = [e for e in journal.effects.of(key) if e.status == "intent"]
        assert [(e.writer, e.data["loads"]) for e in intents] == [("warm", prev)]

        await asyncio.sleep(3.0)  # the stubs of v2's load at start-up (replaced by the pinned one) exit
        before = _stubs(triton.pid)
        action = action_registry()["triton.rollback"](deps)
        params = TritonRollbackParams.model_validate({"keepWarm": "previous"})
        signal = Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {}, datetime.now(timezone.utc), "k1")
        step = action.plan(policy.target, params, await action.observe(policy.target, params), signal)
        assert step.after["version"] == prev and [r["switch"] for r in step.after["replicas"].values()] == ["warm"]
        began = time.monotonic()
        with acting(EXECUTOR, key, 1):
            applied = await action.apply(step, policy.target, params)
        took = time.monotonic() - began
        assert applied.ok, applied.message
        assert took < 1.0, f"the warm switch took {took:.2f}s"
        assert await asyncio.to_thread(served_versions, triton) == [str(prev)]
        assert not (_stubs(triton.pid) - before), "the switch started a backend stub: P was loaded again"
        assert await _served_by(triton.base_url) == str(prev)
        verified = await action.verify(step, policy.target, params)
        assert verified.ok, verified.message

        # Triton reports the config P was loaded with (the warm set's): the switch kept P loaded.
        config = await _config(triton.base_url)
        assert config["version_policy"] == {"specific": {"versions": [prev, newest]}}
        pin = verified.data["pin"]
        assert (pin["version"], pin["from_version"]) == (prev, newest)
        journal.pins.record(key, "ranker", prev, from_version=newest, policy=policy.name)  # as the executor does
        loads = len(journal.effects.of(key))
        for _ in range(2):  # two passes: pins, then warm (a pinned target is not warmed)
            held = (await reconciler.reconcile_once())[key]
            assert held.status.value == "noop", held.message
            assert await reconciler.warm.once() == {}
        assert len(journal.effects.of(key)) == loads, "a pass sent a load: the pin looked drifted"
        assert await asyncio.to_thread(served_versions, triton) == [str(prev)]
        # A second rollback finds P pinned: not "no earlier good version" (P the oldest), nor a walk
        # further into the past (a version below P).
        again = action.plan(policy.target, params, await action.observe(policy.target, params), signal)
        assert again.noop and again.after["version"] == prev, again.summary
    finally:
        journal.close()


async def _config(base_url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base_url}/v2/models/ranker/config") as response:
            assert response.status == 200
            return dict(await response.json())
