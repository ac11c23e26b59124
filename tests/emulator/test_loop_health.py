"""Loops that die are seen (issue 42): a crashed loop of a real Service restarts and is counted; a
poller that keeps crashing turns /readyz and /healthz 503 and makes the leader hand its Lease back.

A real Service on the Kubernetes API emulator's Lease, its HTTP endpoints over loopback; the poller
crashes by a patched method (a bug cannot be made to happen otherwise). Prometheus is a closed
loopback port: the poller exists, and never gets an answer.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from daemon.workers.poller import Poller
from tests.emulator.test_cluster_state import LEASE
from tests.support.helpers import local_settings, notify_policy, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from lab.kube.emulator import KubeEmulator
from tests.support.kube_helpers import kube_settings, write_kubeconfig

LOOPS = {"restartInitialSeconds": 0.05, "restartMaxSeconds": 0.2, "maxCrashes": 3, "crashWindowSeconds": 60}


async def _leader(tmp_path: Path, kube: KubeEmulator) -> Service:
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "p.yaml").write_text(notify_policy("http://127.0.0.1:9/hook"))
    settings = local_settings(tmp_path, pol, kubernetes=kube_settings(write_kubeconfig(tmp_path / "kc", kube)),
                              leaderElection=LEASE, prometheus={"url": "http://127.0.0.1:9"}, loops=LOOPS)
    svc = Service(settings, action_registry(), detector_registry())
    svc.identity = "tailguard-a"
    await svc.__aenter__()
    await wait_for(lambda: svc.is_leader, timeout=10)
    return svc


async def _get(svc: Service, path: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{svc.port}{path}") as resp:
            return resp.status, await resp.json()


def _crashes(svc: Service, component: str) -> float | None:
    return svc.metrics.registry.get_sample_value("tailguard_loop_crashes_total", {"component": component})


async def test_a_poller_that_keeps_crashing_fails_the_probes_and_hands_the_lease_back(
        tmp_path: Path, kube_emulator: KubeEmulator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Every run of the poller raises: it is restarted with backoff (0.05 s, 0.1 s, 0.2 s) and counted;
    at the third crash within the window /readyz and /healthz answer 503 naming it, and the leader
    steps down and clears the Lease's holder so another replica can take over at once."""
    async def broken(self: Poller, stop: asyncio.Event) -> None:
        raise RuntimeError("a bug in the poller")

    monkeypatch.setattr(Poller, "run", broken)
    svc = await _leader(tmp_path, kube_emulator)
    try:
        await wait_for(lambda: svc.loop_trouble() is not None, timeout=10)
        status, ready = await _get(svc, "/readyz")
        assert status == 503 and ready["ready"] is False
        assert ready["loop_error"].startswith("poller crashed 3 times in 60s (limit 3): RuntimeError: a bug")
        assert ready["loop_crashes"]["poller"] >= 3
        status, health = await _get(svc, "/healthz")
        assert status == 503 and health == {"status": "failing", "reason": svc.loop_trouble()}
        await wait_for(lambda: not svc.is_leader, timeout=10)
        await wait_for(lambda: not kube_emulator.get("leases", "tailguard", "tailguard")["spec"].get("holderIdentity"),
                       timeout=10)
        assert svc.elector is not None and (svc.elector.standing_aside or "").startswith("poller crashed")
        assert (_crashes(svc, "poller") or 0) >= 3
        assert not svc.may_act()
    finally:
        await svc.__aexit__(None, None, None)


async def test_a_loop_that_crashes_once_restarts_is_counted_and_the_replica_stays_healthy(
        tmp_path: Path, kube_emulator: KubeEmulator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The poller's first run raises, the second runs: it is running again after the backoff, one
    crash is counted (metric and /readyz), and the probes and the Lease are untouched."""
    runs: list[int] = []
    real = Poller.run

    async def once(self: Poller, stop: asyncio.Event) -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("a bug that happens once")
        await real(self, stop)

    monkeypatch.setattr(Poller, "run", once)
    svc = await _leader(tmp_path, kube_emulator)
    try:
        await wait_for(lambda: len(runs) >= 2, timeout=10)
        assert _crashes(svc, "poller") == 1.0
        assert svc.supervisor.task("poller") is not None
        status, ready = await _get(svc, "/readyz")
        assert status == 200 and ready["loop_crashes"] == {"poller": 1} and ready["loop_error"] is None
        assert (await _get(svc, "/healthz"))[0] == 200
        assert svc.is_leader
        # Every component's child tasks start through the supervisor (counted in its owner's budget).
        spawns = [svc.parts.notifier.spawn, svc.executor._watches.spawn, svc.executor._approvals.spawn,
                  svc.poller.spawn if svc.poller is not None else None]
        assert all(getattr(s, "func", None) == svc.supervisor.child for s in spawns), spawns
    finally:
        await svc.__aexit__(None, None, None)
