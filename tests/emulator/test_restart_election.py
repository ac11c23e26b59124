"""Pending signals and leader election: a signal acknowledged before a restart or a handover is
processed once, by the replica that holds the Lease, and only once it does; an over-age one is
journaled as expired; the policy reload loop outlives any file.

Two replicas on one Lease through the Kubernetes API emulator, real Services, a real notify sink.
"""
from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp
import pytest

import policies.loader
from daemon.http.intake import alert_signals, parse_payload
from daemon.storage.journal import Journal
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from tests.emulator.test_cluster_state import LEASE, POLICY  # the same Lease, notify policy (1h cooldown)
from tests.support.helpers import NotifySink, local_settings, payload_with, post_alerts, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from lab.kube.emulator import KubeEmulator
from tests.support.kube_helpers import kube_settings, write_kubeconfig

FIRST, LATER = "2026-11-29T18:00:00Z", "2026-11-29T18:05:00Z"  # startsAt of two distinct alerts
SETTLE_SECONDS = 1.0  # five renew rounds: a follower that took a pending signal would have decided by then


async def _replica(tmp_path: Path, name: str, kubeconfig: Path | None, sink_url: str, *,
                   journal: Path | None = None, identity: str | None = None,
                   clock: Callable[[], float] = time.time) -> Service:
    """A started Service in tmp_path/name (its journal there unless `journal` names another file)."""
    pol = tmp_path / name / "policies"
    pol.mkdir(parents=True, exist_ok=True)
    (pol / "p.yaml").write_text(POLICY.replace("URL", sink_url))
    extra: dict[str, Any] = {}
    if kubeconfig is not None:
        extra = {"kubernetes": kube_settings(kubeconfig), "leaderElection": LEASE}
    if journal is not None:
        extra["journal"] = {"path": str(journal)}
    svc = Service(local_settings(tmp_path / name, pol, **extra), action_registry(), detector_registry(),
                  clock=clock)
    svc.identity = identity or f"tailguard-{name}"
    await svc.__aenter__()
    return svc


def _stop_workers(svc: Service) -> None:
    """As a crash right after the webhook would: what is journaled from now on is never processed here."""
    for task in svc.supervisor.tasks:
        if task.get_name().startswith("worker-"):
            task.cancel()


async def _journaled(svc: Service) -> tuple[list[str], list[tuple[str, str]]]:
    """(state of each signal, (state, reason) of each decision) in this replica's journal."""
    signals = [s.state for s in await svc.journal.signals.all.in_thread()]
    return signals, [(d.state.value, d.reason) for d in await svc.journal.decisions.all.in_thread()]


async def _stop_all(services: list[Service]) -> None:
    for svc in services:
        await svc.stop()


@pytest.mark.slow
async def test_follower_leaves_a_pending_signal_alone_and_processes_it_once_on_takeover(
        tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """The leader journals a signal (200) and stops before processing it; the follower, on the same
    journal file (a shared volume), neither decides nor marks it while it follows, then takes the
    Lease and processes it exactly once: one notify, one succeeded decision, no failed one."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    journal = tmp_path / "shared" / "journal.db"
    async with NotifySink() as sink:
        services = [await _replica(tmp_path, "a", kubeconfig, sink.url, journal=journal)]
        try:
            a = services[0]
            await wait_for(a.may_act, timeout=5)
            _stop_workers(a)
            assert (await post_alerts(a, payload_with(starts_at=FIRST))).status == 200
            b = await _replica(tmp_path, "b", kubeconfig, sink.url, journal=journal)
            services.append(b)
            await asyncio.sleep(SETTLE_SECONDS)
            assert not b.may_act()
            assert (await post_alerts(b, payload_with(starts_at=LATER))).status == 503  # a follower's answer is unchanged
            assert await _journaled(b) == (["pending"], [])
            assert sink.received == []

            await a.stop()
            services.remove(a)
            await wait_for(b.may_act, timeout=LEASE["leaseDurationSeconds"] + 2)
            await b.drain()
            assert len(sink.received) == 1
            assert await _journaled(b) == (["processed"], [("succeeded", "1 step(s) applied and verified")])
        finally:
            await _stop_all(services)


@pytest.mark.slow
async def test_resend_to_the_new_leader_acts_once_and_the_old_copy_waits_for_the_lease(
        tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """Each replica with its own journal (the chart's emptyDir): the leader journals a signal and stops
    before processing it; Alertmanager's retry reaches the new leader, which acts once. The old leader
    restarts as a follower with its copy still pending: untouched while it follows; when it leads
    again, the copy is decided against the shared cooldown (blocked), never acted on a second time."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    async with NotifySink() as sink:
        services = [await _replica(tmp_path, "a", kubeconfig, sink.url)]
        try:
            a = services[0]
            await wait_for(a.may_act, timeout=5)
            b = await _replica(tmp_path, "b", kubeconfig, sink.url)
            services.append(b)
            _stop_workers(a)
            assert (await post_alerts(a, payload_with(starts_at=FIRST))).status == 200
            await a.stop()
            services.remove(a)

            await wait_for(b.may_act, timeout=LEASE["leaseDurationSeconds"] + 2)
            assert (await post_alerts(b, payload_with(starts_at=FIRST))).status == 200  # Alertmanager's next attempt
            await b.drain()
            assert len(sink.received) == 1

            a = await _replica(tmp_path, "a", kubeconfig, sink.url)  # the same journal, its copy pending
            services.append(a)
            await asyncio.sleep(SETTLE_SECONDS)
            assert not a.may_act()
            assert await _journaled(a) == (["pending"], [])

            await b.stop()
            services.remove(b)
            await wait_for(a.may_act, timeout=LEASE["leaseDurationSeconds"] + 2)
            await a.drain()
            signals, decisions = await _journaled(a)
            assert signals == ["processed"]
            assert [state for state, _ in decisions] == ["blocked"] and decisions[0][1].startswith("cooldown")
            assert len(sink.received) == 1
        finally:
            await _stop_all(services)


@pytest.mark.slow
async def test_restarted_replica_processes_its_pending_signal_once_it_holds_the_lease(
        tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """One replica, election on: it journals a signal and dies before processing it, the Lease still
    held in its old name. Restarted (a new pod name), it leaves the signal pending until the Lease
    expires and it leads, then processes it once."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    async with NotifySink() as sink:
        old = await _replica(tmp_path, "a", kubeconfig, sink.url, identity="tailguard-a-1")
        try:
            await wait_for(old.may_act, timeout=5)
            _stop_workers(old)
            assert (await post_alerts(old, payload_with(starts_at=FIRST))).status == 200
            assert old.elector is not None
            old.elector._release_on_stop = False  # a crash hands nothing back
        finally:
            await old.stop()
        assert kube_emulator.get("leases", "tailguard", "tailguard")["spec"]["holderIdentity"] == "tailguard-a-1"

        new = await _replica(tmp_path, "a", kubeconfig, sink.url, identity="tailguard-a-2")
        try:
            await asyncio.sleep(0.5)  # the old holder's Lease has not expired yet
            assert not new.is_leader
            assert await _journaled(new) == (["pending"], [])
            await wait_for(new.may_act, timeout=LEASE["leaseDurationSeconds"] + 2)
            await new.drain()
            assert len(sink.received) == 1
            assert await _journaled(new) == (["processed"], [("succeeded", "1 step(s) applied and verified")])
        finally:
            await new.stop()


async def test_over_age_pending_signal_is_journaled_as_expired_and_not_acted_on(
        tmp_path: Path, kube_emulator: KubeEmulator) -> None:  # noqa: F811
    """A signal acknowledged 15 minutes before this replica comes to lead (past the 600 s default of
    executor.maxSignalAgeSeconds) gets a blocked 'expired' decision and is marked processed; nothing
    is sent, and that decision does not count for the cooldown (a new alert is acted on)."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    journal = Journal(tmp_path / "a" / "journal.db")
    journal.signals.record(alert_signals(parse_payload(payload_with(starts_at=FIRST))))
    journal.close()
    async with NotifySink() as sink:
        svc = await _replica(tmp_path, "a", kubeconfig, sink.url, clock=lambda: time.time() + 900)
        try:
            await wait_for(svc.may_act, timeout=5)
            await svc.drain()
            signals, decisions = await _journaled(svc)
            assert signals == ["processed"] and len(decisions) == 1
            state, reason = decisions[0]
            assert state == "blocked" and re.fullmatch(
                r"expired: signal is 9\d\ds old \(max 600s\); not acted on", reason), reason
            assert sink.received == []
            assert svc.metrics.registry.get_sample_value(
                "tailguard_decisions_total", {"policy": "ranker-notify", "state": "blocked"}) == 1

            assert (await post_alerts(svc, payload_with(starts_at=LATER))).status == 200
            await svc.drain()
            assert len(sink.received) == 1
            assert (await svc.journal.decisions.all.in_thread())[-1].state == "succeeded"
        finally:
            await svc.stop()


async def test_signal_that_waited_too_long_in_the_backlog_is_expired_when_taken(tmp_path: Path) -> None:
    """No election: a signal admitted while the workers were stuck and taken 700 s later (by the
    service's clock) is expired rather than acted on."""
    now = [time.time()]
    async with NotifySink() as sink:
        svc = await _replica(tmp_path, "a", None, sink.url, clock=lambda: now[0])
        try:
            _stop_workers(svc)
            assert (await post_alerts(svc, payload_with(starts_at=FIRST))).status == 200
            now[0] += 700
            svc.supervisor.spawn("worker-again", svc.backlog.work())
            await svc.drain()
            assert await _journaled(svc) == (
                ["processed"], [("blocked", "expired: signal is 700s old (max 600s); not acted on")])
            assert sink.received == []
        finally:
            await svc.stop()


# ---- the policy reload loop (no election needed) ------------------------------------------------

SECOND_POLICY = POLICY.replace("ranker-notify", "ranker-second").replace("URL", "http://127.0.0.1:9/hook")


async def _readyz(svc: Service) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{svc.port}/readyz") as resp:
            return resp.status, await resp.json()


async def _reported(svc: Service, fragment: str) -> tuple[int, dict[str, Any]]:
    """/readyz once the reload loop reports an error containing `fragment`."""
    await wait_for(lambda: fragment in (svc.last_reload_error or ""), timeout=10)
    return await _readyz(svc)


@pytest.mark.slow
async def test_reload_loop_outlives_any_file_and_picks_up_the_fixed_one(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that is not UTF-8, a file deleted while the reload reads it, and a fault outside the
    loader's checks: each keeps the active set, shows in /readyz and counts once in
    tailguard_policy_reload_errors_total; the loop keeps running and a fixed set is picked up
    (and a set fixed back to the active one clears the error)."""
    async with NotifySink() as sink:
        svc = await _replica(tmp_path, "a", None, sink.url)
        pol = tmp_path / "a" / "policies"
        try:
            (reload_task,) = [t for t in svc.supervisor.tasks if t.get_name() == "policy-reload"]

            def errors() -> float | None:
                return svc.metrics.registry.get_sample_value("tailguard_policy_reload_errors_total")

            (pol / "bad.yaml").write_bytes(b"name: \xff\xfe broken\n")
            status, detail = await _reported(svc, "not UTF-8")
            assert status == 200 and detail["policies"] == 1 and "bad.yaml" in detail["last_reload_error"]
            (pol / "bad.yaml").unlink()  # back to the active set: the error clears
            await wait_for(lambda: svc.last_reload_error is None, timeout=10)

            vanishing = pol / "second.yaml"
            vanishing.write_text(SECOND_POLICY)
            read = policies.loader._read

            def deleted_while_read(file: Path) -> bytes | str:
                if file.name != vanishing.name:
                    return read(file)
                file.unlink()  # listed, then gone before it is read
                try:
                    return read(file)
                finally:
                    file.write_text(SECOND_POLICY)  # back for the next reload, which deletes it again

            monkeypatch.setattr(policies.loader, "_read", deleted_while_read)
            status, detail = await _reported(svc, "second.yaml: cannot read")
            assert status == 200 and detail["policies"] == 1
            monkeypatch.setattr(policies.loader, "_read", read)
            await wait_for(lambda: len(svc.state.policies.policies) == 2, timeout=10)
            assert svc.last_reload_error is None

            def fault(*_: Any) -> None:
                raise RuntimeError("loader bug")

            monkeypatch.setattr("daemon.workers.policy_reload.load_policies", fault)
            status, detail = await _reported(svc, "RuntimeError: loader bug")
            assert status == 200 and detail["policies"] == 2
            monkeypatch.undo()
            vanishing.unlink()
            await wait_for(lambda: len(svc.state.policies.policies) == 1 and svc.last_reload_error is None,
                           timeout=10)
            assert not reload_task.done()
            assert errors() == 3
            status, detail = await _readyz(svc)
            assert status == 200 and detail["last_reload_error"] is None
        finally:
            await svc.stop()
