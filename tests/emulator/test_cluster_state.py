"""Cluster state shared through a ConfigMap: a new leader keeps the old leader's cooldowns and
pins, writes merge on conflict, and a leader that cannot read the state does not act."""
from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient

from core.signal import Signal, SignalSource
from daemon.cluster.cluster_state import ClusterState, parse_document
from daemon.storage.journal import AsyncJournal, Journal
from daemon.common.metrics import Metrics
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import TOKEN, NotifySink, local_settings, payload_with, wait_for
from tests.support.kube.conftest_plugin import kube_api, kube_emulator  # noqa: F401  (fixtures)
from tests.support.kube.emulator import KubeEmulator
from tests.support.kube_helpers import kube_settings, write_kubeconfig

NS, NAME = "tailguard", "tailguard-state"
LEASE = {"enabled": True, "leaseName": "tailguard", "leaseNamespace": NS, "leaseDurationSeconds": 1.5,
         "renewDeadlineSeconds": 1.0, "retryPeriodSeconds": 0.2}
TARGET = "default/ranker"
POLICY = """
name: ranker-notify
target: {model: ranker}
triggers:
  - alert: {name: TritonTailLatencyHigh}
actions:
  - type: notify
    url: URL
guards: {cooldown: 1h}
"""


async def _service(tmp_path: Path, name: str, kubeconfig: Path, sink_url: str) -> Service:
    pol = tmp_path / name / "policies"
    pol.mkdir(parents=True)
    (pol / "p.yaml").write_text(POLICY.replace("URL", sink_url))
    settings = local_settings(tmp_path / name, pol, kubernetes=kube_settings(kubeconfig), leaderElection=LEASE)
    svc = Service(settings, action_registry(), detector_registry())
    svc.identity = f"tailguard-{name}"
    await svc.__aenter__()
    return svc


async def _post(svc: Service, starts_at: str) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{svc.port}/api/v1/alerts", json=payload_with(starts_at=starts_at),
                             headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            return resp.status


def _stored(emulator: KubeEmulator) -> Any:
    return parse_document(emulator.get("configmaps", NS, NAME)["data"]["state.json"])


async def test_new_leader_keeps_the_old_leaders_cooldown_and_pins(
        tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """The old leader acts and pins; after it stops, the new leader blocks a new alert on the old
    cooldown and has the pin in its own journal."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    services: list[Service] = []
    async with NotifySink() as sink:
        try:
            for name in ("a", "b"):
                services.append(await _service(tmp_path, name, kubeconfig, sink.url))
            await wait_for(lambda: any(s.may_act() for s in services), timeout=5)
            leader = next(s for s in services if s.may_act())
            follower = next(s for s in services if s is not leader)
            assert not follower.may_act()
            await leader.journal.record_pin(TARGET, "ranker", 1)  # as a rollback's verify would
            assert await _post(leader, "2026-11-29T18:00:00Z") == 200
            await leader.drain()
            assert len(sink.received) == 1
            await leader.stop()
            services.remove(leader)

            doc = _stored(kube_emulator)
            assert doc.pins[TARGET]["version"] == 1
            assert len(doc.marks[f"ranker-notify|{TARGET}"]) == 1
            await wait_for(follower.may_act, timeout=LEASE["leaseDurationSeconds"] + 2)
            assert [(p["target"], p["version"]) for p in await follower.journal.pins()] == [(TARGET, 1)]
            assert await _post(follower, "2026-11-29T18:05:00Z") == 200
            await follower.drain()
            assert len(sink.received) == 1, "the new leader acted within the old leader's cooldown"
            last = (await follower.journal.decisions())[-1]
            assert last.state == "blocked" and last.reason.startswith("cooldown"), last
        finally:
            for svc in services:
                await svc.stop()


async def test_write_conflict_merges_from_a_fresh_read(tmp_path: Path, kube_emulator: KubeEmulator,  # noqa: F811
                                                       kube_api: ApiClient) -> None:  # noqa: F811
    """A concurrent edit between read and write gives 409; the retry keeps both edits."""
    now = time.time()
    theirs = {"version": 1, "pins": {"serving/other": {"model": "other", "version": 4, "at": now - 5}},
              "guardMarks": {"other|serving/other": [now - 10]}}
    kube_emulator.seed({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": NS},
                        "data": {"state.json": json.dumps(theirs)}})

    def concurrent_edit(emulator: KubeEmulator, _: Any) -> None:
        def add_mark(obj: dict[str, Any]) -> None:
            doc = json.loads(obj["data"]["state.json"])
            doc["guardMarks"]["rival|serving/rival"] = [now - 1]
            obj["data"]["state.json"] = json.dumps(doc)
        emulator.modify("configmaps", NS, NAME, add_mark)

    kube_emulator.after("get", "configmaps", concurrent_edit, times=1)
    journal = AsyncJournal(Journal(tmp_path / "journal.db"))
    try:
        await journal.record_pin(TARGET, "ranker", 2)
        state = ClusterState(kube_api, NS, NAME, journal, Metrics(), lambda: (3600.0, 3))
        state.request_publish()
        await state.flush()
        assert not state.publish_pending
        assert [r.status for r in kube_emulator.requests_for("update", "configmaps")] == [409, 200]
        doc = _stored(kube_emulator)
        assert set(doc.pins) == {"serving/other", TARGET}
        assert set(doc.marks) == {"other|serving/other", "rival|serving/rival"}
    finally:
        journal.sync.close()


async def test_forbidden_state_blocks_acting_until_the_import_succeeds(
        tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """403 on the ConfigMap: recorded as a fault, the leader answers 503 and acts only once a
    retried import succeeds."""
    forbidden = kube_emulator.forbid("get", "configmaps", times=3)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    async with NotifySink() as sink:
        svc = await _service(tmp_path, "a", kubeconfig, sink.url)
        try:
            await wait_for(lambda: svc.is_leader, timeout=5)
            assert not svc.may_act()
            assert await _post(svc, "2026-11-29T18:00:00Z") == 503
            assert svc.metrics.registry.get_sample_value("tailguard_is_leader") == 0
            await wait_for(svc.may_act, timeout=5)
            assert forbidden.fired == 3
            assert svc.metrics.registry.get_sample_value(
                "tailguard_faults_total", {"component": "cluster_state"}) == 3
            assert svc.metrics.registry.get_sample_value("tailguard_is_leader") == 1
            assert await _post(svc, "2026-11-29T18:00:00Z") == 200
            await svc.drain()
            assert len(sink.received) == 1
        finally:
            await svc.stop()


def test_reimported_own_marks_count_once(tmp_path: Path) -> None:
    """A replica that leads again imports marks it exported itself: guard_history counts each plan once."""
    journal = Journal(tmp_path / "journal.db")
    try:
        signal = Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {}, datetime.datetime.now(datetime.timezone.utc),
                        "k1")
        (signal_id, _), = journal.record_signals([signal])[0]
        journal.record_decision(signal_id, "p", TARGET, "succeeded", "", {}, executed=True)
        own = journal.executed_marks(0)
        journal.merge_cluster_state([], [*own, ("p", TARGET, own[0][2] - 60)], since=0)
        last, count = journal.guard_history("p", TARGET, 3600)
        assert (last, count) == (own[0][2], 2)
    finally:
        journal.close()
