"""Kubernetes writes pass the door (daemon/workers/door.py): every PATCH the emulator receives from
istio.shift_weights and the ConfigMap timeout sink was let through by the door (counted, journaled
intent and result), a frozen target gets none, and each keeps its resourceVersion precondition."""
from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient

from actions.base import ActionDeps
from actions.gateway import RetuneTimeout
from actions.istio import ShiftWeights
from core.outcome import OutcomeStatus
from core.query import QueryResult, Sample
from core.target import Target
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.workers.door import EXECUTOR, REVERT, acting
from daemon.workers.state import ExecutorState
from lab.kube.emulator import KubeEmulator
from policies.loader import PolicySet
from tests.emulator.test_gateway_action import params as retune_params
from tests.emulator.test_istio_action import SIGNAL, params, virtual_service, weights_in
from tests.support.fake_triton import CountingDoor
from tests.support.kube.conftest_plugin import kube_api, kube_emulator  # noqa: F401  (fixtures)

NS = "serving"
TARGET = Target(model="reviews", namespace=NS)


class Rig:
    def __init__(self, tmp_path: Path, kube: ApiClient) -> None:
        self.journal = Journal(tmp_path / "journal.db")
        self.deps = ActionDeps(kube=kube)
        self.door = CountingDoor(self.journal, ExecutorState(PolicySet()), self.deps, lambda: True, Metrics())
        self.deps.actuator = self.door


@pytest.fixture
async def rig(tmp_path: Path, kube_api: ApiClient) -> AsyncIterator[Rig]:  # noqa: F811
    r = Rig(tmp_path, kube_api)
    yield r
    r.journal.close()


def _patches(emulator: KubeEmulator) -> list[Any]:
    return [r for r in emulator.requests if r.verb == "patch"]


async def test_every_patch_of_shift_weights_passes_the_door_with_its_precondition(
        rig: Rig, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    kube_emulator.seed(virtual_service(90, 10))
    action = ShiftWeights(rig.deps)
    p = params(route="primary", set={"v2": 0})
    step = action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    with acting(EXECUTOR, TARGET.key, 1):
        assert (await action.apply(step, TARGET, p)).ok
    with acting(REVERT, TARGET.key, 1):
        assert (await action.revert(step, TARGET, p)).ok
    assert weights_in(kube_emulator) == [90, 10]
    patches = _patches(kube_emulator)
    assert len(patches) == rig.door.sent == 2
    for patch in patches:  # the fence carried into the call: a resourceVersion `test` op
        assert any(op["op"] == "test" and op["path"] == "/metadata/resourceVersion" for op in patch.body)
    rows = rig.journal.effects.of(TARGET.key)
    assert [(r.writer, r.status) for r in rows] == [(EXECUTOR, "intent"), (EXECUTOR, "done"),
                                                          (REVERT, "intent"), (REVERT, "done")]


async def test_a_frozen_target_gets_no_patch_and_the_refusal_is_journaled(
        rig: Rig, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    kube_emulator.seed(virtual_service(90, 10))
    rig.journal.freezes.record(TARGET.key, "operator: hands off", float("inf"))
    action = ShiftWeights(rig.deps)
    p = params(route="primary", set={"v2": 0})
    step = action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL)
    with acting(EXECUTOR, TARGET.key, 1):
        outcome = await action.apply(step, TARGET, p)
    assert outcome.status is OutcomeStatus.FAILED and not outcome.retryable
    assert "refused by the door (freeze)" in outcome.message
    assert _patches(kube_emulator) == [] and weights_in(kube_emulator) == [90, 10]
    (row,) = rig.journal.effects.of(TARGET.key)
    assert row.status == "refused" and row.data["check"] == "freeze"


async def test_the_configmap_timeout_sink_writes_through_the_door(
        rig: Rig, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    kube_emulator.seed({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gw", "namespace": NS},
                        "data": {"timeout_ms": "1500"}})

    async def p999(query: str) -> QueryResult:
        return QueryResult(query, (Sample({}, 3000.0),))

    rig.deps.query = p999
    action = RetuneTimeout(rig.deps)
    p = retune_params({"kind": "configmap", "namespace": NS, "name": "gw", "key": "timeout_ms"}, unit="ms")
    target = Target("ranker", NS)
    step = action.plan(target, p, await action.observe(target, p), SIGNAL)
    with acting(EXECUTOR, target.key, 2):
        assert (await action.apply(step, target, p)).ok
    patches = _patches(kube_emulator)
    assert len(patches) == rig.door.sent == 1
    assert any(op["op"] == "test" and op["path"] == "/metadata/resourceVersion" for op in patches[0].body)
    undeclared = await action.revert(step, target, p)  # no writer declared: refused, nothing sent
    assert not undeclared.ok and "refused by the door (writer)" in undeclared.message
    assert len(_patches(kube_emulator)) == 1
