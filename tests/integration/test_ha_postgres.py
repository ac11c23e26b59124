"""Two real daemons on one PostgreSQL journal and one Lease (the Kubernetes API emulator).

Both accept webhooks into the shared journal; only the Lease holder, with the journal's current
term, acts. A burst of distinct alerts is sent round-robin to both, as Alertmanager's retries would
land; the leader is SIGKILLed mid-burst (by PID), its webhooks are resent to the survivor, which
takes the Lease and a new term and finishes the pending signals. Then every acknowledged alert was
acted on (one notify message per alert, by Idempotency-Key) and none twice: each signal has one
decision, and decisions were claimed in both terms.
"""
from __future__ import annotations

import asyncio
import collections
import copy
import os
import signal
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest
import yaml
from aiohttp import web

from daemon.storage.journal import Journal
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.kube.emulator import KubeEmulator
from lab.ports import free_port
from lab.process import ManagedProcess
from tests.support.helpers import (NO_BLAST_RADIUS, TOKEN, local_settings, notify_policy, payload_with, sample_payload,
                                   wait_for)
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from tests.support.kube_helpers import kube_settings, write_kubeconfig
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

NS = "tailguard"
LEASE = {"enabled": True, "leaseName": "tailguard", "leaseNamespace": NS, "leaseDurationSeconds": 2,
         "renewDeadlineSeconds": 1.5, "retryPeriodSeconds": 0.3}
POLICY = notify_policy("URL", "cooldown: 0s, maxActions: 100000")
WEBHOOKS, ALERTS_PER_WEBHOOK = 40, 5
KILL_AFTER = 12  # webhooks acknowledged before the leader is killed
WAIT_SECONDS = 90.0


class Sink:
    """The notify receiver: every POST with its Idempotency-Key and the signal it is about."""

    def __init__(self, delay_seconds: float = 0.0) -> None:
        self.posts: list[tuple[str, str]] = []  # (idempotency key, signal dedup key)
        self.delay_seconds = delay_seconds
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        async def hook(request: web.Request) -> web.Response:
            body = await request.json()
            await asyncio.sleep(self.delay_seconds)
            self.posts.append((request.headers.get("Idempotency-Key", ""), body["signal"]["dedup_key"]))
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_post("/hook", hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}/hook"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class Replica:
    """`tailguard run` in a subprocess as pod `name`; only this process is ever signalled, by PID."""

    def __init__(self, root: Path, name: str, dsn: str, kubeconfig: Path, policies: Path) -> None:
        self.name = f"tailguard-{name}"
        self.port = free_port()
        self.config = root / f"{name}.yaml"
        self.config.write_text(yaml.safe_dump({
            "listen": {"host": "127.0.0.1", "port": self.port},
            "policies": {"path": str(policies), "reloadIntervalSeconds": 60},
            "journal": {"backend": "postgres", "sharedPollSeconds": 0.2},
            "kubernetes": kube_settings(kubeconfig), "leaderElection": LEASE,
            "executor": {"workers": 2, "pinReconcileIntervalSeconds": 3600},
            "log": {"format": "json", "level": "info"}, "blastRadius": NO_BLAST_RADIUS,
        }))
        self.process = ManagedProcess(
            [sys.executable, "-m", "daemon.wiring.cli", "run", "--config", str(self.config)],
            root / f"{name}.log", cwd=REPO,
            env={**os.environ, "TAILGUARD_WEBHOOK_TOKEN": TOKEN, "TAILGUARD_JOURNAL_DSN": dsn,
                 "POD_NAME": self.name, "PYTHONUNBUFFERED": "1"})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.process.start()
        await asyncio.to_thread(self.process.wait_ready, f"{self.url}/readyz", 60)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)


def _webhook(n: int) -> dict[str, Any]:
    """Webhook n: ALERTS_PER_WEBHOOK firing alerts with fingerprints of their own."""
    body = copy.deepcopy(sample_payload())
    template = body["alerts"][0]
    body["alerts"] = []
    for i in range(ALERTS_PER_WEBHOOK):
        alert = copy.deepcopy(template)
        alert["fingerprint"] = f"ha{n:03d}x{i}"
        body["alerts"].append(alert)
    return body


def _holder(emulator: KubeEmulator) -> str | None:
    lease = emulator.get("leases", NS, "tailguard")  # None until a replica creates it (get never raises KeyError)
    return lease["spec"].get("holderIdentity") if lease is not None else None


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    s = Sink()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def slow_sink() -> AsyncIterator[Sink]:
    """A receiver that takes 30 ms per message: the leader is mostly inside a step's call."""
    s = Sink(delay_seconds=0.03)
    await s.start()
    yield s
    await s.stop()


class Burst:
    """Webhooks to the replicas round-robin; one that fails or is unavailable is resent to the other
    until a replica journals it (as Alertmanager resends); bounded."""

    def __init__(self, replicas: dict[str, Replica]) -> None:
        self.replicas = list(replicas.values())
        self.answered: collections.Counter[tuple[str, int]] = collections.Counter()  # (replica, status)
        self.acknowledged: set[int] = set()
        self.unavailable: set[str] = set()  # replicas a sender would time out on (killed, paused)

    async def send(self, http: aiohttp.ClientSession, n: int) -> None:
        for attempt in range(400):
            replica = self.replicas[(n + attempt) % 2]
            if replica.name in self.unavailable:
                await asyncio.sleep(0.01)
                continue
            try:
                async with http.post(f"{replica.url}/api/v1/alerts", json=_webhook(n),
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                    self.answered[(replica.name, resp.status)] += 1
                    if resp.status == 200:
                        self.acknowledged.add(n)
                        return
            except aiohttp.ClientError:
                self.answered[(replica.name, -1)] += 1
            await asyncio.sleep(0.05)
        raise AssertionError(f"webhook {n} was never acknowledged: {self.answered}")

    async def run(self, numbers: range) -> None:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(self.send(http, n) for n in numbers))


EXPECTED = {f"ha{n:03d}x{i}" for n in range(WEBHOOKS) for i in range(ALERTS_PER_WEBHOOK)}


def _notified(sink: Sink) -> set[str]:
    return {dedup.split(":")[1] for _, dedup in sink.posts}


async def _wait_acted_on_all(sink: Sink, dsn: str) -> None:
    """Until every alert was notified and its signal is no longer pending (the decision finished)."""
    await wait_for(lambda: _notified(sink) >= EXPECTED, timeout=WAIT_SECONDS)
    journal = Journal(dsn)
    try:
        await wait_for(lambda: journal.signals.refresh_pending() == 0, timeout=WAIT_SECONDS, interval=0.2)
    finally:
        journal.close()


async def _start_pair(tmp_path: Path, dsn: str, emulator: KubeEmulator,
                      sink: Sink) -> tuple[dict[str, Replica], Replica, Replica]:
    """Two started replicas: (all by name, the Lease holder, the other)."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.yaml").write_text(POLICY.replace("URL", sink.url))
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", emulator)
    replicas = {r.name: r for r in (Replica(tmp_path, n, dsn, kubeconfig, policies) for n in "ab")}
    await asyncio.gather(*(r.start() for r in replicas.values()))
    await wait_for(lambda: _holder(emulator) in replicas, timeout=45)
    leader = replicas[str(_holder(emulator))]
    return replicas, leader, next(r for r in replicas.values() if r is not leader)


def _assert_each_alert_acted_on_once(sink: Sink, dsn: str, first: Replica, second: Replica) -> None:
    """One Idempotency-Key per alert (a second action would be a second decision, with a key of its
    own; a message re-sent after a crash or by a new leader carries the key it had), every signal
    processed with one succeeded decision, decisions claimed by `first` in an earlier term than by
    `second`, which holds the journal's term now (a decision `first` had in hand when it died or
    froze is claimed anew by `second` when it resumes it)."""
    keys_per_alert: dict[str, set[str]] = collections.defaultdict(set)
    for key, dedup in sink.posts:
        keys_per_alert[dedup.split(":")[1]].add(key)
    assert set(keys_per_alert) == EXPECTED
    assert {a: k for a, k in keys_per_alert.items() if len(k) != 1} == {}

    journal = Journal(dsn)
    try:
        signals = journal.signals.all()
        decisions = journal.decisions.all()
        claims = journal.read("SELECT holder, MAX(term) AS term, COUNT(*) AS n FROM decisions GROUP BY holder")
        term = journal.terms.current()
    finally:
        journal.close()
    assert len(signals) == len(EXPECTED) and {s.state for s in signals} == {"processed"}
    assert len({d.signal_id for d in decisions}) == len(decisions) == len(EXPECTED)
    assert {d.state for d in decisions} == {"succeeded"}, collections.Counter(d.state for d in decisions)
    by_holder = {r["holder"]: (int(r["term"]), int(r["n"])) for r in claims}
    assert term is not None and term.holder == second.name and term.term == by_holder[second.name][0]
    assert set(by_holder) == {first.name, second.name}, by_holder
    assert by_holder[first.name][0] < by_holder[second.name][0], by_holder


async def test_two_daemons_share_the_journal_and_a_killed_leader_loses_nothing_and_repeats_nothing(
        tmp_path: Path, postgres_dsn: str, kube_emulator: KubeEmulator, sink: Sink) -> None:  # noqa: F811
    replicas, leader, survivor = await _start_pair(tmp_path, postgres_dsn, kube_emulator, sink)
    try:
        burst = Burst(replicas)
        await burst.run(range(KILL_AFTER))
        await wait_for(lambda: len(sink.posts) >= 5, timeout=WAIT_SECONDS)
        leader.kill()  # mid-burst: the leader is still working through what it acknowledged
        burst.unavailable.add(leader.name)
        await burst.run(range(KILL_AFTER, WEBHOOKS))
        assert burst.acknowledged == set(range(WEBHOOKS))
        # Both replicas journaled webhooks before the kill (no 503 from the follower).
        assert burst.answered[(survivor.name, 200)] >= 1 and burst.answered[(leader.name, 200)] >= 1
        assert not any(status == 503 for (_, status) in burst.answered), burst.answered
        await _wait_acted_on_all(sink, postgres_dsn)
        assert _holder(kube_emulator) == survivor.name
    finally:
        for r in replicas.values():
            await asyncio.to_thread(r.process.stop)
    _assert_each_alert_acted_on_once(sink, postgres_dsn, leader, survivor)


async def test_a_paused_leader_that_wakes_after_a_takeover_is_fenced_off(
        tmp_path: Path, postgres_dsn: str, kube_emulator: KubeEmulator, slow_sink: Sink) -> None:  # noqa: F811
    """SIGSTOP the leader mid-burst (a GC pause, a frozen node) for longer than the Lease: the other
    replica takes the Lease and a new term and goes on. On SIGCONT the old leader still believes it
    leads for a moment, with signals and a step in hand; the journal refuses its writes (its term is
    gone), so it never acts on a signal the new leader owns, and it falls back to follower."""
    sink = slow_sink
    replicas, leader, other = await _start_pair(tmp_path, postgres_dsn, kube_emulator, sink)
    try:
        burst = Burst(replicas)
        await burst.run(range(KILL_AFTER))
        await wait_for(lambda: len(sink.posts) >= 5, timeout=WAIT_SECONDS)
        os.kill(leader.process.pid, signal.SIGSTOP)
        burst.unavailable.add(leader.name)
        try:
            await burst.run(range(KILL_AFTER, 2 * KILL_AFTER))
            # The Lease expires after 2 s; under load (and with the paused one's transaction to be
            # ended by the server after 5 s) the takeover may take longer.
            await wait_for(lambda: _holder(kube_emulator) == other.name, timeout=45)
            await wait_for(lambda: len(sink.posts) > 0 and sink.posts[-1][1].split(":")[1] >= f"ha{KILL_AFTER:03d}",
                           timeout=WAIT_SECONDS)  # the new leader acts
        finally:
            os.kill(leader.process.pid, signal.SIGCONT)
        burst.unavailable.clear()
        await burst.run(range(2 * KILL_AFTER, WEBHOOKS))  # to both again: the woken one is a follower
        assert burst.acknowledged == set(range(WEBHOOKS))
        await _wait_acted_on_all(sink, postgres_dsn)
        assert _holder(kube_emulator) == other.name
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{leader.url}/readyz") as resp:
                ready = await resp.json()
        assert ready["acting"] is False and ready["leader"] is False, ready
        # It woke with a signal in hand and tried to go on: the journal refused (logged, not retried).
        assert "replaced as leader while processing" in leader.process.log_tail(200_000), leader.process.log_tail()
    finally:
        for r in (leader, other):  # the woken one first: stopping the holder hands it the Lease back
            if r.process.running:
                os.kill(r.process.pid, signal.SIGCONT)
            await asyncio.to_thread(r.process.stop)
    _assert_each_alert_acted_on_once(sink, postgres_dsn, leader, other)


# ---- the operator API on a follower -----------------------------------------------------------

READER, OPERATOR = "reader-token-5a1e9c0b", "operator-token-77d2f1aa"
TOKENS = f"""
- {{name: dashboards, token: {READER}, scopes: [read]}}
- {{name: alice, token: {OPERATOR}, scopes: [read, write]}}
"""


async def _service(tmp_path: Path, name: str, dsn: str, kubeconfig: Path, sink_url: str,
                   shared_poll_seconds: float = 0.2) -> Service:
    pol = tmp_path / name / "policies"
    pol.mkdir(parents=True)
    (pol / "p.yaml").write_text(POLICY.replace("URL", sink_url))
    settings = local_settings(tmp_path / name, pol, kubernetes=kube_settings(kubeconfig), leaderElection=LEASE,
                              journal={"backend": "postgres", "dsn": dsn, "sharedPollSeconds": shared_poll_seconds})
    svc = Service(settings, action_registry(), detector_registry())
    svc.identity = f"tailguard-{name}"
    await svc.__aenter__()
    return svc


async def _call(svc: Service, method: str, path: str, token: str = OPERATOR, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"http://127.0.0.1:{svc.port}{path}", json=body,
                                headers={"Authorization": f"Bearer {token}"}) as resp:
            return resp.status, await resp.json()


async def test_a_follower_answers_from_the_shared_journal_and_its_freeze_binds_the_leader(
        tmp_path: Path, postgres_dsn: str, kube_emulator: KubeEmulator, sink: Sink,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Status, freeze and unfreeze sent to the follower read and write the journal the leader acts
    on; a webhook the follower journals is decided by the leader; approve stays with the leader."""
    monkeypatch.setenv("TAILGUARD_API_TOKENS", TOKENS)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    services = [await _service(tmp_path, n, postgres_dsn, kubeconfig, sink.url) for n in "ab"]
    try:
        await wait_for(lambda: any(s.may_act() for s in services), timeout=30)
        leader = next(s for s in services if s.may_act())
        follower = next(s for s in services if s is not leader)

        status, frozen = await _call(follower, "POST", "/api/v1/freeze",
                                     body={"target": "default/ranker", "reason": "maintenance"})
        assert status == 201, frozen
        status, body = await _call(follower, "POST", "/api/v1/alerts", body=payload_with(fingerprint="f1"),
                                   token=TOKEN)
        assert status == 200, body
        await wait_for(lambda: len(leader.journal.decisions.all()) == 1, timeout=30)
        (blocked,) = leader.journal.decisions.all()
        assert blocked.state == "blocked" and "target frozen: maintenance" in blocked.reason, blocked
        assert sink.posts == []

        status, lifted = await _call(follower, "POST", "/api/v1/unfreeze", body={"target": "default/ranker"})
        assert status == 200 and len(lifted["lifted"]) == 1, lifted
        status, body = await _call(follower, "POST", "/api/v1/alerts", body=payload_with(fingerprint="f2"),
                                   token=TOKEN)
        assert status == 200, body
        await wait_for(lambda: len(sink.posts) == 1, timeout=30)

        await wait_for(lambda: leader.journal.decisions.all()[-1].state.final, timeout=30)
        status, doc = await _call(follower, "GET", "/api/v1/status", token=READER)
        assert status == 200 and doc["role"] == "follower" and doc["replica"] == follower.identity
        (target,) = doc["targets"]
        assert target["lastDecision"]["state"] == "succeeded" and target["freeze"] is None, target
        assert target["policies"][0]["actionsInWindow"] == 1

        status, refused = await _call(follower, "POST", "/api/v1/approvals/1/approve", body={})
        assert status == 503 and refused["leader"] == leader.identity, refused
    finally:
        for svc in services:
            await svc.stop()


async def test_a_pending_approval_survives_failover_and_the_new_leader_applies_it(
        tmp_path: Path, postgres_dsn: str, kube_emulator: KubeEmulator, sink: Sink,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan waiting for approval is a journal row: after the leader stops, the new leader
    approves it from the shared journal and applies it once."""
    monkeypatch.setenv("TAILGUARD_API_TOKENS", TOKENS)
    monkeypatch.setattr(sys.modules[__name__], "POLICY", POLICY + "approval: required\napprovalTimeoutSeconds: 600\n")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    services = [await _service(tmp_path, n, postgres_dsn, kubeconfig, sink.url) for n in "ab"]
    try:
        await wait_for(lambda: any(s.may_act() for s in services), timeout=30)
        old = next(s for s in services if s.may_act())
        new = next(s for s in services if s is not old)
        status, body = await _call(old, "POST", "/api/v1/alerts", body=payload_with(fingerprint="f1"), token=TOKEN)
        assert status == 200, body
        await wait_for(lambda: [a.id for a in old.journal.approvals.all("pending")] == [1], timeout=30)
        await old.stop()  # hands the Lease back
        services.remove(old)
        await wait_for(new.may_act, timeout=30)
        status, approved = await _call(new, "POST", "/api/v1/approvals/1/approve", body={"reason": "looked at it"})
        assert status == 202, approved
        await wait_for(lambda: len(sink.posts) == 1, timeout=30)
        await wait_for(lambda: new.journal.decisions.all()[0].state == "succeeded", timeout=30)
        assert len(new.journal.decisions.all()) == 1
    finally:
        for svc in services:
            await svc.stop()


async def test_the_leader_takes_a_followers_webhook_at_its_commit_not_at_its_next_poll(
        tmp_path: Path, postgres_dsn: str, kube_emulator: KubeEmulator, sink: Sink) -> None:  # noqa: F811
    """With a poll of the shared backlog far longer than the test, the follower's committed signals
    reach the leader through the journal's notices (LISTEN/NOTIFY)."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    services = [await _service(tmp_path, n, postgres_dsn, kubeconfig, sink.url, shared_poll_seconds=60)
                for n in "ab"]
    try:
        await wait_for(lambda: any(s.may_act() for s in services), timeout=30)
        leader = next(s for s in services if s.may_act())
        follower = next(s for s in services if s is not leader)
        for n in range(3):  # each wakes it again
            status, body = await _call(follower, "POST", "/api/v1/alerts", token=TOKEN,
                                       body=payload_with(fingerprint=f"n{n}"))
            assert status == 200, body
            await wait_for(lambda: len(sink.posts) == n + 1, timeout=20)  # well inside the 60 s poll
        assert [d.state for d in leader.journal.decisions.all()] == ["succeeded"] * 3
        assert follower.journal.decisions.all() == leader.journal.decisions.all()
    finally:
        for svc in services:
            await svc.stop()
