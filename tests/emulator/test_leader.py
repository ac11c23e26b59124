"""Lease leader election: one leader of two, takeover after expiry, step-down before expiry,
and two real Services where exactly one acts."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient

from daemon.common.config import LeaderElectionSettings
from daemon.cluster.leader import LeaderElectionError, LeaderElector
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.support.helpers import NotifySink, local_settings, notify_policy, payload_with, post_alerts, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from lab.kube.emulator import KubeEmulator
from tests.support.kube_helpers import kube_settings, write_kubeconfig

LEASE = {"leaseName": "tailguard", "leaseNamespace": "tailguard", "leaseDurationSeconds": 1.5,
         "renewDeadlineSeconds": 1.0, "retryPeriodSeconds": 0.2}
SETTINGS = LeaderElectionSettings.model_validate({"enabled": True, **LEASE})


class Replica:
    """One elector with its own ApiClient, recording (monotonic time, is_leader) changes."""

    def __init__(self, emulator: KubeEmulator, name: str, release: bool = True,
                 settings: LeaderElectionSettings = SETTINGS) -> None:
        self.api = ApiClient(configuration=emulator.configuration())
        self.changes: list[tuple[float, bool]] = []
        self.elector = LeaderElector(self.api, settings, name,
                                     lambda leader: self.changes.append((time.monotonic(), leader)),
                                     release_on_stop=release)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.elector.run(self.stop), name=f"elector-{name}")

    @property
    def leader(self) -> bool:
        return self.elector.is_leader

    async def close(self, *, crash: bool = False) -> None:
        if crash:  # dies: no step-down write, no release
            self.task.cancel()
        self.stop.set()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.api.close()


def test_renew_deadline_must_be_below_lease_duration() -> None:
    """Settings that could let two leaders overlap are refused."""
    bad = LeaderElectionSettings.model_validate({**LEASE, "renewDeadlineSeconds": 2})
    with pytest.raises(LeaderElectionError, match="renewDeadlineSeconds"):
        LeaderElector(None, bad, "a", lambda _: None)  # type: ignore[arg-type]


@pytest.mark.slow
async def test_one_of_two_leads_and_the_other_takes_over_after_expiry(kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """Exactly one leads; when it dies without releasing, the other leads within the lease duration."""
    a, b = Replica(kube_emulator, "a", release=False), Replica(kube_emulator, "b", release=False)
    try:
        await wait_for(lambda: a.leader or b.leader, timeout=5)
        await asyncio.sleep(0.6)  # several renew rounds: still exactly one
        assert a.leader != b.leader
        leader, follower = (a, b) if a.leader else (b, a)
        lease = kube_emulator.get("leases", "tailguard", "tailguard")
        assert lease["spec"]["holderIdentity"] == leader.elector.identity
        assert lease["spec"]["leaseDurationSeconds"] == 2 and lease["spec"]["leaseTransitions"] == 0
        died = time.monotonic()
        await leader.close(crash=True)
        await wait_for(lambda: follower.leader, timeout=5)
        took = follower.changes[-1][0] - died
        assert SETTINGS.lease_duration_seconds - 0.5 <= took <= SETTINGS.lease_duration_seconds + 1.0
        lease = kube_emulator.get("leases", "tailguard", "tailguard")
        assert lease["spec"]["holderIdentity"] == follower.elector.identity
        assert lease["spec"]["leaseTransitions"] == 1
    finally:
        await a.close()
        await b.close()


@pytest.mark.slow
async def test_partitioned_leader_steps_down_before_the_lease_can_be_taken(kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A leader cut off from the API calls on_change(False) before the other replica acquires."""
    a = Replica(kube_emulator, "a")
    try:
        await wait_for(lambda: a.leader, timeout=5)
        b = Replica(kube_emulator, "b")
        await asyncio.sleep(0.5)
        assert not b.leader
        a.api.configuration.host = "http://127.0.0.1:9"  # a's network to the API is gone
        await wait_for(lambda: b.leader, timeout=5)
        stepped_down = next(t for t, leader in a.changes if not leader)
        took_over = next(t for t, leader in b.changes if leader)
        assert stepped_down < took_over, (stepped_down, took_over)
        assert not a.leader
    finally:
        await a.close()
        await b.close()


@pytest.mark.slow
async def test_clean_stop_releases_the_lease_for_a_fast_handover(kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A leader that stops cleanly hands the Lease back: the successor needs no expiry wait. The
    Lease lasts 30 s here, so a takeover within 10 s can only be the release (a 1.5 s Lease made the
    bound a race with a loaded machine's scheduling)."""
    long = LeaderElectionSettings.model_validate({**LEASE, "leaseDurationSeconds": 30, "renewDeadlineSeconds": 20})
    a = Replica(kube_emulator, "a", settings=long)
    await wait_for(lambda: a.leader, timeout=5)
    b = Replica(kube_emulator, "b", settings=long)
    try:
        stopped = time.monotonic()
        await a.close()
        await wait_for(lambda: b.leader, timeout=10)
        assert b.changes[-1][0] - stopped < long.lease_duration_seconds / 3
    finally:
        await b.close()


POLICY = notify_policy("URL")


@pytest.mark.slow
async def test_two_services_exactly_one_acts_and_the_other_takes_over(
        tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """Two real Services on one Lease: the leader acts (200), the follower answers 503; after the
    leader stops, the follower leads and acts."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    services = []
    async with NotifySink() as sink:
        for name in ("a", "b"):
            pol = tmp_path / name / "policies"
            pol.mkdir(parents=True)
            (pol / "p.yaml").write_text(POLICY.replace("URL", sink.url))
            settings = local_settings(tmp_path / name, pol, kubernetes=kube_settings(kubeconfig),
                                      leaderElection={"enabled": True, **LEASE})
            svc = Service(settings, action_registry(), detector_registry())
            svc.identity = f"tailguard-{name}"
            await svc.start()
            services.append(svc)
        try:
            await wait_for(lambda: any(s.may_act() for s in services), timeout=5)
            await asyncio.sleep(0.5)
            leaders = [s for s in services if s.may_act()]
            assert len(leaders) == 1
            leader = leaders[0]
            follower = next(s for s in services if s is not leader)
            assert (await post_alerts(follower, payload_with(starts_at="2026-11-29T18:00:00Z"))).status == 503
            assert (await post_alerts(leader, payload_with(starts_at="2026-11-29T18:00:00Z"))).status == 200
            await leader.drain()
            assert len(sink.received) == 1
            await leader.stop()
            services.remove(leader)
            await wait_for(follower.may_act, timeout=SETTINGS.lease_duration_seconds + 1)
            assert (await post_alerts(follower, payload_with(starts_at="2026-11-29T18:05:00Z"))).status == 200
            await follower.drain()
            assert len(sink.received) == 2
            assert kube_emulator.get("leases", "tailguard", "tailguard")["spec"]["holderIdentity"] == "tailguard-" + (
                "b" if leader.identity == "tailguard-a" else "a")
        finally:
            for svc in services:
                await svc.stop()


@pytest.mark.slow
async def test_workers_take_no_signal_while_leadership_is_lost(
        tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A leader cut off from the API steps down with three signals held in its backlog: they go back
    to the journal, and workers started meanwhile take none (no decision, nothing sent). When it
    leads again it reads them back and processes each once."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    async with NotifySink() as sink:
        pol = tmp_path / "policies"
        pol.mkdir()
        (pol / "p.yaml").write_text(POLICY.replace("URL", sink.url))
        settings = local_settings(tmp_path, pol, kubernetes=kube_settings(kubeconfig),
                                  leaderElection={"enabled": True, **LEASE})
        async with Service(settings, action_registry(), detector_registry()) as svc:
            await wait_for(svc.may_act, timeout=5)
            workers = [t for t in svc.supervisor.tasks if t.get_name().startswith("worker-")]
            for task in workers:
                task.cancel()
            for minute in range(3):
                assert (await post_alerts(svc, payload_with(starts_at=f"2026-11-29T18:0{minute}:00Z"))).status == 200
            host = svc.kube.configuration.host
            svc.kube.configuration.host = "http://127.0.0.1:9"  # its network to the API is gone
            await wait_for(lambda: not svc.may_act(), timeout=SETTINGS.renew_deadline_seconds + 2)
            for n in range(2):
                svc.supervisor.spawn(f"worker-again-{n}", svc.backlog.work())
            await asyncio.sleep(0.5)
            assert [s.state for s in await svc.journal.signals.all.in_thread()] == ["pending"] * 3
            assert await svc.journal.decisions.all.in_thread() == [] and sink.received == []

            svc.kube.configuration.host = host
            await wait_for(svc.may_act, timeout=5)
            await svc.drain()
            assert len(sink.received) == 3
            assert [s.state for s in await svc.journal.signals.all.in_thread()] == ["processed"] * 3
            decisions = await svc.journal.decisions.all.in_thread()
            assert sorted(d.signal_id for d in decisions) == [1, 2, 3]
            assert {d.state for d in decisions} == {"succeeded"}


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_new_leader_waits_the_lease_and_the_request_timeout_before_an_unfenced_write(
        kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A leads (it created the Lease: no fence) and is paused: its election loop never runs again.
    B takes the Lease once it looked unrenewed for the Lease duration, and may not send a Triton write
    for the Lease duration plus the write's timeout after that. A, resumed, may not write either: its
    renew deadline passed on the monotonic clock, though its loop has not looked yet."""
    clock = Clock()
    apis = [ApiClient(configuration=kube_emulator.configuration()) for _ in range(2)]
    a = LeaderElector(apis[0], SETTINGS, "a", lambda _: None, monotonic=clock)
    b = LeaderElector(apis[1], SETTINGS, "b", lambda _: None, monotonic=clock)
    try:
        await a._round()
        assert a.is_leader and a.may_write() and a.write_fence_seconds(5.0) == 0.0
        await b._round()  # sees a's record: held
        assert not b.is_leader and not b.may_write()
        lease = 2.0  # leaseDurationSeconds as written in the Lease: 1.5 rounded up
        clock.now += lease + 0.1  # a is paused: no renew
        await b._round()
        assert b.is_leader
        assert b.write_fence_seconds(5.0) == pytest.approx(lease + 5.0)
        assert b.may_write()  # it leads; the fence is the wait before the first write
        clock.now += lease + 4.9
        assert b.write_fence_seconds(5.0) == pytest.approx(0.1)
        clock.now += 0.1
        assert b.write_fence_seconds(5.0) == 0.0
        assert a.is_leader and not a.may_write()  # resumed: the flag is stale, the clock is not
    finally:
        for api in apis:
            await api.close()


async def test_a_lease_handed_back_fences_only_the_request_timeout(kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A stopped cleanly and handed the Lease back (its tasks were cancelled first): B takes it at
    once and waits only the write's timeout (a request A had sent may still be running), not the Lease."""
    clock = Clock()
    apis = [ApiClient(configuration=kube_emulator.configuration()) for _ in range(2)]
    a = LeaderElector(apis[0], SETTINGS, "a", lambda _: None, monotonic=clock)
    b = LeaderElector(apis[1], SETTINGS, "b", lambda _: None, monotonic=clock)
    try:
        await a._round()
        a._set(False, "stopping")
        await a._release()
        clock.now += SETTINGS.retry_period_seconds
        await b._round()
        assert b.is_leader and b.write_fence_seconds(5.0) == pytest.approx(5.0)
    finally:
        for api in apis:
            await api.close()


async def test_a_leader_that_may_not_lead_steps_down_hands_the_lease_back_and_waits(
        kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """While `may_lead` names a reason (its journal cannot be written) the leader steps down and
    clears the Lease's holder, so the other replica takes it at its next round, not after the
    lease duration; it does not campaign until the reason clears."""
    trouble: list[str] = []
    api = ApiClient(configuration=kube_emulator.configuration())
    changes: list[bool] = []
    elector = LeaderElector(api, SETTINGS, "a", changes.append, may_lead=lambda: trouble[0] if trouble else None)
    stop = asyncio.Event()
    task = asyncio.create_task(elector.run(stop), name="elector-a")
    b = None
    try:
        await wait_for(lambda: elector.is_leader, timeout=10)
        trouble.append("journal writes failing for 5.0s: disk I/O error")
        await wait_for(lambda: not elector.is_leader, timeout=10)
        assert elector.standing_aside == trouble[0] and changes == [True, False]
        await wait_for(lambda: not kube_emulator.get("leases", "tailguard", "tailguard")["spec"].get("holderIdentity"),
                       timeout=10)
        b = Replica(kube_emulator, "b")
        await wait_for(lambda: b is not None and b.leader, timeout=10)
        assert b.changes[-1][1] is True and not elector.is_leader
        await asyncio.sleep(3 * SETTINGS.retry_period_seconds)
        assert not elector.is_leader  # it does not campaign while standing aside
        trouble.clear()
        await b.close()  # hands the Lease back: the healthy one takes it again
        b = None
        await wait_for(lambda: elector.is_leader, timeout=10)
        assert elector.standing_aside is None
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
        if b is not None:
            await b.close()
