"""keepWarm on the real Triton (issue 44): after a deploy the warm keeper loads v1 beside v2 through
the door; the rollback is then a switch (a config update of the loaded v1, no new Python-backend
stub started, well under a second) and v1 serves alone."""
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


async def test_keep_warm_loads_v1_beside_v2_and_the_rollback_switches_without_a_load(
        tmp_path: Path, triton_factory: Any) -> None:
    # precompile: a production repository does not change under a loaded version (lab/triton.py).
    triton = await triton_factory(name="ranker", precompile=True)
    assert await asyncio.to_thread(served_versions, triton) == ["2"]
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
        assert warmed.ok and set(warmed.data["warmed"].values()) == {1}, warmed.message
        assert await asyncio.to_thread(served_versions, triton) == ["1", "2"]
        assert await _served_by(triton.base_url) == "2"  # unversioned requests still go to the newest
        assert (await reconciler.warm.once())[key].status.value == "noop"
        intents = [e for e in journal.effects.of(key) if e["status"] == "intent"]
        assert [(e["writer"], e["data"]["loads"]) for e in intents] == [("warm", 1)]

        await asyncio.sleep(3.0)  # the stubs of v2's load at start-up (replaced by the pinned one) exit
        before = _stubs(triton.pid)
        action = action_registry()["triton.rollback"](deps)
        params = TritonRollbackParams.model_validate({"keepWarm": "previous"})
        signal = Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {}, datetime.now(timezone.utc), "k1")
        step = action.plan(policy.target, params, await action.observe(policy.target, params), signal)
        assert step.after["version"] == 1 and [r["switch"] for r in step.after["replicas"].values()] == ["warm"]
        began = time.monotonic()
        with acting(EXECUTOR, key, 1):
            applied = await action.apply(step, policy.target, params)
        took = time.monotonic() - began
        assert applied.ok, applied.message
        assert took < 1.0, f"the warm switch took {took:.2f}s"
        assert await asyncio.to_thread(served_versions, triton) == ["1"]
        assert not (_stubs(triton.pid) - before), "the switch started a backend stub: v1 was loaded again"
        assert await _served_by(triton.base_url) == "1"
        assert (await action.verify(step, policy.target, params)).ok
    finally:
        journal.close()
