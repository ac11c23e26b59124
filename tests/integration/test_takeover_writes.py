"""A leader paused mid-decision does not write to Triton after a takeover: one load in all.

Two real daemons on one PostgreSQL journal and one Lease (the Kubernetes API emulator), the real
Triton behind a TCP proxy the test controls. The leader journals its decision and the step's intent
and starts the apply; the proxy SIGSTOPs it (by PID) as its apply re-reads the replica, before the
load. The other daemon takes the Lease once it lapses, takes a term, resumes the decision from the
journal and waits out the write fence (the Lease duration plus the load's timeout) before its first
Triton write. While it waits, the old leader is resumed (SIGCONT): its renew deadline has passed on
its monotonic clock, so its apply sends no load (and its journal writes are fenced). The new leader
re-observes after the fence and loads once. Journal writes fenced by term, Kubernetes writes by
compare-and-swap, and now Triton writes by the Lease's clock: one effect.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest
import yaml

from daemon.storage.journal import Journal
from lab.fault_proxy import FaultProxy
from lab.kube.emulator import KubeEmulator
from lab.kube.seeds import kube_settings, write_kubeconfig
from lab.policies import ALERT_ONLY_VERIFY, PAGE_ALERT_TRIGGER
from lab.ports import free_port
from lab.process import ManagedProcess
from lab.triton import TritonServer, served_versions
from tests.support.helpers import NO_BLAST_RADIUS, TOKEN, sample_payload, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

NS = "tailguard"
LEASE = {"enabled": True, "leaseName": "tailguard", "leaseNamespace": NS, "leaseDurationSeconds": 2,
         "renewDeadlineSeconds": 1.5, "retryPeriodSeconds": 0.3}
LOAD_TIMEOUT_SECONDS = 5  # the new leader's fence: 2 s (Lease) + 5 s
INDEX, LOAD = b"/v2/repository/index", b"/v2/repository/models/ranker/load"
WAIT_SECONDS = 90.0


class Daemon:
    """`tailguard run` as pod `name`; only this process is ever signalled, by PID."""

    def __init__(self, root: Path, name: str, dsn: str, kubeconfig: Path, policies: Path) -> None:
        self.name = f"tailguard-{name}"
        self.port = free_port()
        config = root / f"{name}.yaml"
        config.write_text(yaml.safe_dump({
            "listen": {"host": "127.0.0.1", "port": self.port},
            "policies": {"path": str(policies), "reloadIntervalSeconds": 60},
            "journal": {"backend": "postgres", "sharedPollSeconds": 0.2},
            "kubernetes": kube_settings(kubeconfig), "leaderElection": LEASE,
            "executor": {"workers": 1, "pinReconcileIntervalSeconds": 3600, "tritonTimeoutSeconds": 30},
            "log": {"format": "json", "level": "info"}, "blastRadius": NO_BLAST_RADIUS,
        }))
        self.process = ManagedProcess(
            [sys.executable, "-m", "daemon.wiring.cli", "run", "--config", str(config)], root / f"{name}.log",
            cwd=REPO, env={**os.environ, "TAILGUARD_WEBHOOK_TOKEN": TOKEN, "TAILGUARD_JOURNAL_DSN": dsn,
                           "POD_NAME": self.name, "PYTHONUNBUFFERED": "1"})
        self.paused = False

    async def start(self) -> None:
        self.process.start()
        await asyncio.to_thread(self.process.wait_ready, f"http://127.0.0.1:{self.port}/readyz", 60)

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.paused:
            os.kill(self.process.pid, signal.SIGCONT)
            self.paused = False

    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")


def _holder(emulator: KubeEmulator) -> str | None:
    try:
        return emulator.get("leases", NS, "tailguard")["spec"].get("holderIdentity")
    except KeyError:
        return None


@pytest.fixture
async def proxy(triton_server: TritonServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", triton_server.http_port) as p:
        yield p


async def test_a_paused_leader_resumed_after_a_takeover_sends_no_triton_load(
        tmp_path: Path, postgres_dsn: str, kube_emulator: KubeEmulator,  # noqa: F811
        triton_server: TritonServer, proxy: FaultProxy) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "ranker.yaml").write_text(f"""
name: ranker-tail
target:
  model: ranker
  triton: {{endpoints: ["{proxy.url}"]}}
triggers:
{PAGE_ALERT_TRIGGER}actions:
  - type: triton.rollback
    loadTimeoutSeconds: {LOAD_TIMEOUT_SECONDS}
guards: {{cooldown: 0s}}
{ALERT_ONLY_VERIFY}""")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    daemons = {d.name: d for d in (Daemon(tmp_path, n, postgres_dsn, kubeconfig, policies) for n in "ab")}
    try:
        await asyncio.gather(*(d.start() for d in daemons.values()))
        await wait_for(lambda: _holder(kube_emulator) in daemons, timeout=45)
        old = daemons[str(_holder(kube_emulator))]
        new = next(d for d in daemons.values() if d is not old)

        reads = [0]

        def second_read() -> None:  # observe read the index once; the apply's re-read is the second
            reads[0] += 1
            if reads[0] == 2:
                old.pause()
        proxy.on(INDEX, second_read, once=False)

        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://127.0.0.1:{old.port}/api/v1/alerts", json=sample_payload(),
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                assert resp.status == 200, await resp.text()
        await wait_for(lambda: old.paused, timeout=WAIT_SECONDS)
        journal = Journal(postgres_dsn)
        try:
            (decision,) = journal.decisions.all()
            assert decision.state == "executing"
            assert [s.phase for s in journal.decisions.steps(decision.id)] == ["intent"]  # then paused

            await wait_for(lambda: _holder(kube_emulator) == new.name, timeout=WAIT_SECONDS)
            await wait_for(lambda: "waiting out the takeover fence" in new.log(), timeout=WAIT_SECONDS)
            assert proxy.count(LOAD) == 0
            old.resume()  # mid-fence: the old leader's apply goes on from where it was paused
            await wait_for(lambda: "replaced as leader while processing" in old.log(), timeout=WAIT_SECONDS)
            await wait_for(lambda: journal.decisions.get(decision.id).state != "executing",  # type: ignore[union-attr]
                           timeout=WAIT_SECONDS, interval=0.2)
            done = journal.decisions.get(decision.id)
            term = journal.terms.current()
            pins = journal.pins.live()
        finally:
            journal.close()
        assert done is not None and done.state == "succeeded", done
        assert term is not None and term.holder == new.name  # the old leader's writes are fenced by term
        assert proxy.count(LOAD) == 1  # the new leader's, after its fence; none from the resumed one
        assert await asyncio.to_thread(served_versions, triton_server, "ranker") == ["1"]
        assert [(p.version, p.from_version) for p in pins] == [(1, 2)]
        # The resumed leader's load was stopped at the door (daemon/workers/door.py): by its leadership,
        # its fenced intent (the journal's term moved on) or the write fence (its Lease clock), never sent.
        assert '"event": "write refused"' in old.log() or "Triton write not sent" in old.log()
    finally:
        for d in daemons.values():
            d.resume()
            await asyncio.to_thread(d.process.stop)
