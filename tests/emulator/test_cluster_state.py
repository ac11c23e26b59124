"""Cluster state shared through a ConfigMap: a new leader keeps the old leader's cooldowns and
pins, writes merge on conflict, and a leader that cannot read the state does not act."""
from __future__ import annotations

import asyncio
import datetime
import json
import time
from pathlib import Path
from typing import Any

import pytest

from kubernetes_asyncio.client import ApiClient

from core.signal import Signal, SignalSource
from daemon.cluster.cluster_state import ClusterState, journal_document, merge_documents, parse_document
from daemon.storage.journal import Journal
from daemon.storage.records import ExecutedMark, MergeCounts, Pin
from daemon.common.metrics import Metrics
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import NotifySink, local_settings, notify_policy, payload_with, post_alerts, wait_for
from tests.support.kube.conftest_plugin import kube_api, kube_emulator  # noqa: F401  (fixtures)
from lab.kube.emulator import KubeEmulator
from tests.support.kube_helpers import kube_settings, write_kubeconfig

NS, NAME = "tailguard", "tailguard-state"
LEASE = {"enabled": True, "leaseName": "tailguard", "leaseNamespace": NS, "leaseDurationSeconds": 1.5,
         "renewDeadlineSeconds": 1.0, "retryPeriodSeconds": 0.2}
TARGET = "default/ranker"
POLICY = notify_policy("URL", "cooldown: 1h")


async def _service(tmp_path: Path, name: str, kubeconfig: Path, sink_url: str) -> Service:
    pol = tmp_path / name / "policies"
    pol.mkdir(parents=True)
    (pol / "p.yaml").write_text(POLICY.replace("URL", sink_url))
    settings = local_settings(tmp_path / name, pol, kubernetes=kube_settings(kubeconfig), leaderElection=LEASE)
    svc = Service(settings, action_registry(), detector_registry())
    svc.identity = f"tailguard-{name}"
    await svc.__aenter__()
    return svc


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
            await leader.journal.pins.record.in_thread(TARGET, "ranker", 1)  # as a rollback's verify would
            assert (await post_alerts(leader, payload_with(starts_at="2026-11-29T18:00:00Z"))).status == 200
            await leader.drain()
            assert len(sink.received) == 1
            await leader.stop()
            services.remove(leader)

            doc = _stored(kube_emulator)
            assert doc.pins[TARGET]["version"] == 1
            assert len(doc.marks[f"ranker-notify|{TARGET}"]) == 1
            await wait_for(follower.may_act, timeout=LEASE["leaseDurationSeconds"] + 2)
            assert [(p.target, p.version) for p in await follower.journal.pins.live.in_thread()] == [(TARGET, 1)]
            assert (await post_alerts(follower, payload_with(starts_at="2026-11-29T18:05:00Z"))).status == 200
            await follower.drain()
            assert len(sink.received) == 1, "the new leader acted within the old leader's cooldown"
            last = (await follower.journal.decisions.all.in_thread())[-1]
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
    journal = Journal(tmp_path / "journal.db")
    try:
        await journal.pins.record.in_thread(TARGET, "ranker", 2)
        state = ClusterState(kube_api, NS, NAME, journal, Metrics(), lambda: (3600.0, 3))
        state.request_publish()
        await state.flush()
        assert not state.publish_pending
        assert [r.status for r in kube_emulator.requests_for("update", "configmaps")] == [409, 200]
        doc = _stored(kube_emulator)
        assert set(doc.pins) == {"serving/other", TARGET}
        assert set(doc.marks) == {"other|serving/other", "rival|serving/rival"}
    finally:
        journal.close()


@pytest.mark.slow
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
            assert (await post_alerts(svc, payload_with(starts_at="2026-11-29T18:00:00Z"))).status == 503
            assert svc.metrics.registry.get_sample_value("tailguard_is_leader") == 0
            await wait_for(svc.may_act, timeout=5)
            assert forbidden.fired == 3
            assert svc.metrics.registry.get_sample_value(
                "tailguard_faults_total", {"component": "cluster_state"}) == 3
            assert svc.metrics.registry.get_sample_value("tailguard_is_leader") == 1
            assert (await post_alerts(svc, payload_with(starts_at="2026-11-29T18:00:00Z"))).status == 200
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
        (signal_id, _), = journal.signals.record([signal])[0]
        journal.decisions.record(signal_id, "p", TARGET, "succeeded", "", {}, executed=True)
        own = journal.decisions.executed_marks(0)
        journal.cluster.merge([], [*own, ExecutedMark("p", TARGET, own[0].at - 60)], since=0)
        last, count = journal.decisions.guard_history("p", TARGET, 3600)
        assert (last, count) == (own[0][2], 2)
    finally:
        journal.close()


def _stored_or_empty(emulator: KubeEmulator) -> Any:
    obj = emulator.get("configmaps", NS, NAME)
    return parse_document((obj or {}).get("data", {}).get("state.json"))


async def test_new_leader_drops_an_ended_pin_and_keeps_bad_versions_and_freezes(
        tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """The old leader pins (marking the version rolled back from bad), publishes, then ends the pin
    and freezes the target: the new leader, which still held the pin from an earlier import, ends
    it instead of importing it, knows the bad version, and its guard blocks the frozen target."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    services: list[Service] = []
    async with NotifySink() as sink:
        try:
            for name in ("a", "b"):
                services.append(await _service(tmp_path, name, kubeconfig, sink.url))
            await wait_for(lambda: any(s.may_act() for s in services), timeout=5)
            leader = next(s for s in services if s.may_act())
            follower = next(s for s in services if s is not leader)
            assert leader.cluster_state is not None
            await leader.journal.pins.record.in_thread(TARGET, "ranker", 1, from_version=2)  # version 2 marked bad
            leader.cluster_state.request_publish()
            await wait_for(lambda: TARGET in _stored_or_empty(kube_emulator).pins, timeout=5)
            (pin,) = await leader.journal.pins.live.in_thread()
            # The follower led before and imported the pin then: it holds it in its own journal.
            await follower.journal.cluster.merge.in_thread([Pin(TARGET, "ranker", 1, pin.at)], [], 0)

            assert await leader.journal.pins.end.in_thread(TARGET, "rolled forward: version 3 is served") is not None
            await leader.journal.freezes.record.in_thread(TARGET, "escalated: did not recover", time.time() + 3600)
            leader.cluster_state.request_publish()
            await wait_for(lambda: TARGET in _stored_or_empty(kube_emulator).ends, timeout=5)
            doc = _stored(kube_emulator)
            assert TARGET not in doc.pins
            assert doc.ends[TARGET]["at"] == pin.at
            assert doc.bad[(TARGET, 2)]["at"] > 0
            assert [k[0] for k in doc.freezes] == [TARGET]
            assert json.loads(kube_emulator.get("configmaps", NS, NAME)["data"]["state.json"])["version"] == 2
            await leader.stop()
            services.remove(leader)

            await wait_for(follower.may_act, timeout=LEASE["leaseDurationSeconds"] + 2)
            assert await follower.journal.pins.live.in_thread() == []
            ended = await follower.journal.pins.ended.in_thread(TARGET)
            assert [(e.at, e.ended_reason) for e in ended] == [(pin.at, "rolled forward: version 3 is served")]
            assert await follower.journal.bad_versions.known.in_thread(TARGET) == frozenset({2})
            frozen = await follower.journal.freezes.active_on.in_thread(TARGET)
            assert frozen is not None and frozen.reason == "escalated: did not recover"
            assert (await post_alerts(follower, payload_with(starts_at="2026-11-29T18:05:00Z"))).status == 200
            await follower.drain()
            assert sink.received == [], "the new leader acted on a target the old leader froze"
            last = (await follower.journal.decisions.all.in_thread())[-1]
            assert last.state == "blocked" and "target frozen" in last.reason, last

            assert follower.cluster_state is not None
            await wait_for(lambda: not follower.cluster_state.publish_pending, timeout=5)  # type: ignore[union-attr]
            assert TARGET not in _stored(kube_emulator).pins, "the new leader published the ended pin again"
        finally:
            for svc in services:
                await svc.stop()


async def test_version_1_document_still_imports(tmp_path: Path, kube_emulator: KubeEmulator,  # noqa: F811
                                                kube_api: ApiClient) -> None:  # noqa: F811
    """A document written by an older replica (version 1: pins and guard marks only) imports, and a
    publish that adds nothing of the newer sections keeps it version 1."""
    now = time.time()
    old = {"version": 1, "pins": {TARGET: {"model": "ranker", "version": 4, "at": now - 5}},
           "guardMarks": {f"ranker-notify|{TARGET}": [now - 10]}}
    kube_emulator.seed({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": NS},
                        "data": {"state.json": json.dumps(old)}})
    journal = Journal(tmp_path / "journal.db")
    stop = asyncio.Event()
    state = ClusterState(kube_api, NS, NAME, journal, Metrics(), lambda: (3600.0, 3))
    task = asyncio.create_task(state.run(stop))
    try:
        state.leadership_changed(True)
        await wait_for(lambda: state.imported and not state.publish_pending, timeout=5)
        pins = await journal.pins.live.in_thread()
        assert [(p.target, p.version, p.at) for p in pins] == [(TARGET, 4, now - 5)]
        assert await journal.decisions.guard_history.in_thread("ranker-notify", TARGET, 3600) == (now - 10, 1)
        assert json.loads(kube_emulator.get("configmaps", NS, NAME)["data"]["state.json"])["version"] == 1
    finally:
        stop.set()
        await task
        journal.close()


def test_shared_state_import_is_idempotent_and_carries_clears_and_lifts(tmp_path: Path) -> None:
    """Importing the same document twice changes nothing; an end wins over a pin with the same `at`;
    a clear and a lift end the marks and freezes they cover; a render/parse round trip is exact."""
    source, dest = Journal(tmp_path / "a.db"), Journal(tmp_path / "b.db")
    try:
        now = time.time()
        source.pins.record(TARGET, "ranker", 1, from_version=3)
        source.pins.record("default/other", "other", 5, from_version=6)
        source.freezes.record(TARGET, "escalated", now + 3600)
        source.freezes.record("default/other", "escalated too", now + 3600)
        doc = journal_document(source.pins.live(), [], source.cluster.shared_state(now - 3600, now))
        assert parse_document(doc.render()) == doc
        pins = [Pin(t, p["model"], p["version"], p["at"]) for t, p in doc.pins.items()]
        assert dest.cluster.merge(pins, [], 0, doc.shared(), now) == MergeCounts(pins=2, marks=0, other=4)
        assert dest.cluster.merge(pins, [], 0, doc.shared(), now) == MergeCounts(pins=0, marks=0, other=0)
        assert dest.bad_versions.known(TARGET) == {3} and dest.freezes.active_on(TARGET, now) is not None

        source.pins.end(TARGET, "unpinned")
        source.bad_versions.clear(TARGET, 3, "fixed in 4")
        source.freezes.lift(TARGET, "operator")
        later = journal_document(source.pins.live(), [], source.cluster.shared_state(now - 3600, now))
        merged = merge_documents(doc, later, now - 3600, 3, now=now)  # the stale pin meets its end
        assert set(merged.pins) == {"default/other"} and (TARGET, 3) not in merged.bad
        assert [k[0] for k in merged.freezes] == ["default/other"]
        stale = [Pin(TARGET, "ranker", 1, doc.pins[TARGET]["at"])]  # an older replica still publishes it
        assert dest.cluster.merge(stale, [], 0, merged.shared(), now) == MergeCounts(pins=1, marks=0, other=2)
        assert dest.cluster.merge(stale, [], 0, merged.shared(), now) == MergeCounts(pins=0, marks=0, other=0)
        assert [p.target for p in dest.pins.live()] == ["default/other"]
        assert dest.bad_versions.known(TARGET) == frozenset() and dest.bad_versions.known("default/other") == {6}
        assert dest.freezes.active_on(TARGET, now) is None and dest.freezes.active_on("default/other", now) is not None
    finally:
        source.close()
        dest.close()
