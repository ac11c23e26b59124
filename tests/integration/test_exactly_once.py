"""A real crash between an effect and its journal record: one effect, for notify, Istio and Triton.

The daemon runs as `tailguard run` in a subprocess. The side that receives its effect (a notify
receiver, the Kubernetes API emulator, a loopback proxy in front of the real Triton) performs the
effect, SIGKILLs the daemon by its PID and only then answers, so the daemon dies after the call
and before it could journal the result: the decision stays `executing` with an intent and no
result. A second daemon on the same journal resumes the decision; we assert it ends `succeeded`
and that the effect happened once:

- notify is at-least-once with an idempotency key: the resumed decision cannot observe a sent
  message, so it POSTs again, with the same `Idempotency-Key`; the receiver, keeping the keys it
  has seen, delivers one message;
- Istio: the resumed decision re-observes the VirtualService, finds the weights and our
  `tailguard.io/decision` annotation in place, and records the step as recovered: one PATCH;
- Triton: it re-observes the replicas, finds only the target version served, and records the step
  as recovered: one load.

The emulator-backed tests at the end check the stamp every Kubernetes write carries.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from actions.base import ActionDeps
from actions.gateway import RetuneTimeout, RetuneTimeoutParams
from actions.istio import ShiftWeights, ShiftWeightsParams
from core.outcome import OutcomeStatus
from core.query import QueryResult, Sample
from core.target import Target
from daemon.storage.journal import Journal
from daemon.storage.records import Decision, StepRow
from lab.ports import free_port
from lab.process import ManagedProcess
from lab.triton import TritonServer, served_versions
from tests.support.helpers import NO_BLAST_RADIUS, TOKEN, sample_payload, wait_for
from lab.kube.emulator import KubeEmulator, RecordedRequest
from lab.kube.schemas import object_errors
from tests.support.kube_helpers import http_route, kube_settings, virtual_service, write_kubeconfig
from tests.support.paths import REPO

NS = "serving"
TARGET = Target("ranker", NS)
SIGNAL: Any = None  # the actions below plan without reading the signal
ANNOTATION = "tailguard.io/decision"
WAIT_SECONDS = 60.0


# ---- the daemon in a subprocess ------------------------------------------------------------------


class Daemon:
    """`tailguard run --config ...` in a subprocess; only this process is ever signalled, by PID."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.tmp_path = tmp_path
        self.port = free_port()
        policies = tmp_path / "policies"
        policies.mkdir(exist_ok=True)
        self.policy_file = policies / "policy.yaml"
        self.journal = tmp_path / "journal.db"
        self.config = tmp_path / "config.yaml"
        self.config.write_text(yaml.safe_dump({
            "listen": {"host": "127.0.0.1", "port": self.port},
            "policies": {"path": str(policies), "reloadIntervalSeconds": 60},
            "journal": {"path": str(self.journal)},
            "executor": {"workers": 1, "pinReconcileIntervalSeconds": 3600},
            "log": {"format": "json", "level": "info"},
            "blastRadius": NO_BLAST_RADIUS,
            **settings,
        }))
        self.runs: list[ManagedProcess] = []
        self.killed: list[int] = []  # PIDs the receiving side SIGKILLed

    def policy(self, text: str) -> None:
        self.policy_file.write_text(text)

    @property
    def process(self) -> ManagedProcess:
        return self.runs[-1]

    async def start(self) -> None:
        """Start a new daemon process on the same config and journal; wait until it is ready."""
        run = ManagedProcess([sys.executable, "-m", "daemon.wiring.cli", "run", "--config", str(self.config)],
                             self.tmp_path / f"daemon-{len(self.runs)}.log", cwd=REPO,
                             env={**os.environ, "TAILGUARD_WEBHOOK_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"})
        self.runs.append(run)
        run.start()
        await asyncio.to_thread(run.wait_ready, f"http://127.0.0.1:{self.port}/readyz", WAIT_SECONDS)

    async def alert(self) -> None:
        """POST the Alertmanager sample (TritonTailLatencyHigh on ranker); 200 once journaled."""
        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://127.0.0.1:{self.port}/api/v1/alerts", json=sample_payload(),
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                assert resp.status == 200, await resp.text()

    async def kill(self) -> None:
        """SIGKILL the running daemon (the crash) and wait until it is gone; bounded."""
        pid = self.process.pid
        os.kill(pid, signal.SIGKILL)
        self.killed.append(pid)
        await wait_until(lambda: not self.process.running, "the daemon to die")

    async def wait_killed(self) -> None:
        await wait_until(lambda: bool(self.killed) and not self.process.running,
                         "the receiving side to kill the daemon", self.process)

    async def wait_decided(self) -> None:
        await wait_until(lambda: _decided(self.journal), "the resumed decision to finish", self.process)

    async def stop(self) -> None:
        for run in self.runs:
            await asyncio.to_thread(run.stop)

    def log(self) -> str:
        return "\n".join(run.log_tail() for run in self.runs)


async def wait_until(predicate: Callable[[], bool], what: str, process: ManagedProcess | None = None) -> None:
    """`wait_for` (bounded), failing with what was awaited and the daemon's log."""
    try:
        await wait_for(predicate, WAIT_SECONDS)
    except AssertionError as exc:
        raise AssertionError(f"timed out waiting for {what}"
                             + (f"; daemon log:\n{process.log_tail()}" if process else "")) from exc


def _decided(journal: Path) -> bool:
    """Whether the journal holds a decision that is over (read-only, beside the running daemon)."""
    try:
        with closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)) as db:
            states = [state for (state,) in db.execute("SELECT state FROM decisions")]
    except sqlite3.Error:
        return False
    return bool(states) and "executing" not in states


@dataclass(frozen=True)
class Journaled:
    """What a stopped daemon left in its journal: its one decision with its step rows (without the
    rows of its recovery check: the alert-only policy's required verify block, whose outcome is
    irrelevant here), the signals' states and the pins."""

    decision: Decision
    steps: list[StepRow]
    signals: list[str]
    pins: list[tuple[str, int]]


def read_journal(path: Path) -> Journaled:
    journal = Journal(path)
    try:
        (decision,) = journal.decisions.all()
        steps = [s for s in journal.decisions.steps(decision.id) if s.phase != "recovery"]
        return Journaled(decision, steps, [s.state for s in journal.signals.all()],
                         [(p.model, int(p.version)) for p in journal.pins.live()])
    finally:
        journal.close()


@pytest.fixture
async def daemon_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Daemon]]:
    made: list[Daemon] = []

    def make(**settings: Any) -> Daemon:
        made.append(Daemon(tmp_path, **settings))
        return made[-1]

    try:
        yield make
    finally:
        for daemon in made:
            await daemon.stop()


async def crash_then_resume(daemon: Daemon) -> Journaled:
    """Run 1 acts and is killed by the receiving side; check the journal it left (the decision
    `executing`, one intent and no result); run 2 resumes on the same journal. Returns its journal."""
    await daemon.start()
    await daemon.alert()
    await daemon.wait_killed()
    assert daemon.killed == [daemon.runs[0].pid]
    crashed = read_journal(daemon.journal)
    key = f"{crashed.decision.id}/0"
    assert crashed.decision.state == "executing", crashed.decision.reason
    assert [(s.phase, s.data["effect_key"]) for s in crashed.steps] == [("intent", key)], crashed.steps
    assert crashed.signals == ["pending"]

    await daemon.start()
    await daemon.wait_decided()
    await daemon.stop()
    resumed = read_journal(daemon.journal)
    assert resumed.decision.state == "succeeded", f"{resumed.decision.reason}\n{daemon.log()}"
    assert resumed.signals == ["processed"]
    return resumed


POLICY = """
name: {name}
target:
  model: ranker
{triton}triggers:
  - alert: {{name: TritonTailLatencyHigh, matchers: {{severity: page}}, actsUngoverned: true}}
actions:
  - {action}
guards: {{cooldown: 0s}}
# alert-only: a verify block is required; its outcome is irrelevant here (onNotRecovered: none)
verify: {{query: 'vector(0)', below: 1, onNotRecovered: none}}
"""


def policy(name: str, action: str, triton_url: str | None = None) -> str:
    triton = f"  triton: {{endpoints: [\"{triton_url}\"]}}\n" if triton_url else ""
    return POLICY.format(name=name, action=action, triton=triton)


# ---- an HTTP side that kills the daemon ----------------------------------------------------------


async def serve(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> tuple[web.AppRunner, str]:
    """`handler` for every path on a loopback port; the runner (to clean up) and the base URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


class NotifyReceiver:
    """A pager bridge that delivers each Idempotency-Key once; on its first request it SIGKILLs the
    daemon before answering, as a crash right after the POST landed."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.requests: list[tuple[str | None, dict[str, Any]]] = []  # (Idempotency-Key, body)
        self.delivered: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        key, body = request.headers.get("Idempotency-Key"), await request.json()
        self.requests.append((key, body))
        if key is None or key not in {k for k, _ in self.requests[:-1]}:
            self.delivered.append(body)
        if len(self.requests) == 1:
            await self.daemon.kill()
        return web.Response(status=200)


class KillingTritonProxy:
    """Forwards everything to the real Triton; after Triton answered the first model load, it
    SIGKILLs the daemon and only then passes the answer on."""

    def __init__(self, triton: TritonServer, daemon: Daemon) -> None:
        self.triton, self.daemon = triton, daemon
        self.loads: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        async with aiohttp.ClientSession() as http:
            async with http.request(request.method, f"{self.triton.base_url}{request.path_qs}",
                                    data=await request.read(), headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=120)) as upstream:
                status, body = upstream.status, await upstream.read()
                content_type = upstream.headers.get("Content-Type")
        if request.method == "POST" and request.path.endswith("/load"):
            self.loads.append(request.path)
            if len(self.loads) == 1:
                await self.daemon.kill()
        return web.Response(status=status, body=body, headers={"Content-Type": content_type} if content_type else {})


# ---- the three crashes ---------------------------------------------------------------------------


@pytest.mark.integration
async def test_notify_killed_after_the_post_is_delivered_once_by_its_idempotency_key(
        tmp_path: Path, daemon_factory: Callable[..., Daemon]) -> None:
    """At-least-once with a key: the POST that killed the daemon and the resumed decision's POST
    carry the same Idempotency-Key; the receiver delivers one message."""
    runner: web.AppRunner | None = None
    try:
        daemon = daemon_factory()
        receiver = NotifyReceiver(daemon)
        runner, url = await serve(receiver.handle)
        daemon.policy(policy("page", f"{{type: notify, url: \"{url}/hook\"}}"))

        journaled = await crash_then_resume(daemon)
    finally:
        if runner is not None:
            await runner.cleanup()

    key = f"{journaled.decision.id}/0"
    assert [k for k, _ in receiver.requests] == [key, key]
    assert len(receiver.delivered) == 1 and receiver.delivered[0]["signal"]["name"] == "TritonTailLatencyHigh"
    assert [(s.phase, s.status, s.data.get("attempt")) for s in journaled.steps] == [
        ("intent", "pending", 1), ("intent", "pending", 2), ("apply", "ok", 2), ("verify", "noop", None)]


def weighted_virtual_service() -> dict[str, Any]:
    vs = virtual_service()
    vs["metadata"]["annotations"] = {"owner": "search-team"}
    vs["spec"]["http"][0]["route"] = [{"destination": {"host": "ranker", "subset": s}, "weight": w}
                                      for s, w in (("v1", 90), ("v2", 10))]
    return vs


@pytest.mark.integration
async def test_istio_killed_after_the_patch_landed_is_recovered_without_a_second_patch(
        tmp_path: Path, kube_emulator: KubeEmulator, daemon_factory: Callable[..., Daemon]) -> None:
    """Exactly-once by re-observation: the emulator applies the PATCH, then kills the daemon before
    answering; the resumed decision finds the weights and its own annotation, and records the
    step as recovered. One PATCH of the weights in all."""
    kube_emulator.seed(weighted_virtual_service())
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    daemon = daemon_factory(kubernetes=kube_settings(kubeconfig))
    daemon.policy(policy("shift", "{type: istio.shift_weights, virtualService: {namespace: serving, name: ranker}, "
                                  "set: {v2: 0}}"))

    async def kill_after_patch(emulator: KubeEmulator, request: RecordedRequest) -> None:
        if request.status == 200 and not daemon.killed:
            await daemon.kill()

    kube_emulator.after("patch", "virtualservices", kill_after_patch, times=None)

    journaled = await crash_then_resume(daemon)
    key, rows = f"{journaled.decision.id}/0", journaled.steps

    assert [r.status for r in kube_emulator.requests_for("patch", "virtualservices")] == [200]
    stored = kube_emulator.get("virtualservices", NS, "ranker")
    assert stored is not None
    assert [d["weight"] for d in stored["spec"]["http"][0]["route"]] == [100, 0]
    assert stored["metadata"]["annotations"] == {"owner": "search-team", ANNOTATION: key}
    assert [(s.phase, s.status) for s in rows] == [("intent", "pending"), ("apply", "ok"), ("verify", "ok")]
    assert rows[1].message.startswith("recovered after restart: attempt 1 had landed")
    assert f"stamped {key} by this step's write" in rows[1].message


@pytest.mark.integration
async def test_triton_killed_after_the_load_is_recovered_without_a_second_load(
        tmp_path: Path, triton_server: TritonServer, daemon_factory: Callable[..., Daemon]) -> None:
    """Exactly-once by re-observation: Triton loads v1 pinned, the proxy kills the daemon before
    passing the answer on; the resumed decision finds only v1 served and records the step as
    recovered, not re-applied. One load in all."""
    assert served_versions(triton_server) == ["2"]
    runner: web.AppRunner | None = None
    try:
        daemon = daemon_factory()
        proxy = KillingTritonProxy(triton_server, daemon)
        runner, url = await serve(proxy.handle)
        daemon.policy(policy("rollback", "{type: triton.rollback, to: previous}", triton_url=url))

        journaled = await crash_then_resume(daemon)
    finally:
        if runner is not None:
            await runner.cleanup()

    rows = journaled.steps
    assert served_versions(triton_server) == ["1"] and journaled.pins == [("ranker", 1)]
    assert proxy.loads == ["/v2/repository/models/ranker/load"]
    assert [(s.phase, s.status) for s in rows] == [("intent", "pending"), ("apply", "ok"), ("verify", "ok")]
    assert rows[1].message.startswith("recovered after restart: attempt 1 had landed")
    assert rows[1].data["recovered"] is True


# ---- the stamp of every Kubernetes write, against the emulator -------------------------------------


def _configmap() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gw", "namespace": NS},
            "data": {"t": "2000"}}


async def _p999(query: str) -> QueryResult:
    return QueryResult(query, (Sample({}, 4.0),))


@pytest.mark.parametrize("seed,resource,sink", [
    (lambda: virtual_service(timeout="2s"), "virtualservices", {"kind": "istio", "namespace": NS, "name": "ranker"}),
    (lambda: http_route(timeouts={"request": "2s"}), "httproutes",
     {"kind": "httproute", "namespace": NS, "name": "ranker"}),
    (_configmap, "configmaps", {"kind": "configmap", "namespace": NS, "name": "gw", "key": "t"}),
])
async def test_every_kubernetes_timeout_write_is_stamped_and_recognised(
        kube_api: ApiClient, kube_emulator: KubeEmulator, seed: Callable[[], dict[str, Any]], resource: str,
        sink: dict[str, Any]) -> None:
    """A retune with an effect key stamps the object (schema-valid, no other annotation lost);
    applying the step again finds the value and our stamp: a noop that says so, no second write."""
    obj = seed()
    obj["metadata"]["annotations"] = {"keep": "me"}
    kube_emulator.seed(obj)
    action = RetuneTimeout(ActionDeps(kube=kube_api, query=_p999))
    p = RetuneTimeoutParams.model_validate({"query": "p999", "maxMs": 60000, "sink": sink})
    step = replace(action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL), effect_key="7/1")

    assert (await action.apply(step, TARGET, p)).status is OutcomeStatus.OK
    (stored,) = kube_emulator.objects(resource, NS)
    assert stored["metadata"]["annotations"] == {"keep": "me", ANNOTATION: "7/1"}
    assert object_errors(stored) == []
    again = await action.apply(step, TARGET, p)
    assert again.status is OutcomeStatus.NOOP and again.data["ours"] is True
    assert "this step's own write had landed" in again.message
    verified = await action.verify(step, TARGET, p)
    assert verified.ok and verified.data["ours"] is True
    assert len([w for w in kube_emulator.writes if w.verb == "patch"]) == 1


async def test_weights_write_adds_the_annotations_map_when_the_object_has_none(
        kube_api: ApiClient, kube_emulator: KubeEmulator) -> None:
    """Without metadata.annotations the stamp adds the map, in the same guarded PATCH; someone
    else's value found in place (no stamp of ours) is a plain noop."""
    vs = weighted_virtual_service()
    del vs["metadata"]["annotations"]
    kube_emulator.seed(vs)
    action = ShiftWeights(ActionDeps(kube=kube_api))
    p = ShiftWeightsParams.model_validate({"virtualService": {"namespace": NS, "name": "ranker"}, "set": {"v2": 0}})
    step = replace(action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL), effect_key="3/0")

    outcome = await action.apply(step, TARGET, p)
    assert outcome.status is OutcomeStatus.OK, outcome.message
    assert [r.status for r in kube_emulator.requests_for("patch")] == [200]
    stored = kube_emulator.get("virtualservices", NS, "ranker")
    assert stored is not None and stored["metadata"]["annotations"] == {ANNOTATION: "3/0"}
    assert object_errors(stored) == []
    other = await action.apply(replace(step, effect_key="4/0"), TARGET, p)
    assert other.status is OutcomeStatus.NOOP and "ours" not in other.data


async def test_http_timeout_sink_sends_the_effect_key_as_idempotency_key() -> None:
    """The HTTP endpoint sink cannot be stamped: its PUT carries `Idempotency-Key: <effect key>`."""
    puts: list[dict[str, str]] = []
    timeout = {"timeoutMs": 2000}

    async def admin(request: web.Request) -> web.Response:
        if request.method == "PUT":
            puts.append(dict(request.headers))
            timeout.update(await request.json())
        return web.json_response(timeout)

    runner, url = await serve(admin)
    try:
        action = RetuneTimeout(ActionDeps(query=_p999))
        p = RetuneTimeoutParams.model_validate({"query": "p999", "maxMs": 60000, "sink": {"kind": "http", "url": url}})
        step = replace(action.plan(TARGET, p, await action.observe(TARGET, p), SIGNAL), effect_key="9/2")
        assert (await action.apply(step, TARGET, p)).ok
    finally:
        await runner.cleanup()
    assert [h.get("Idempotency-Key") for h in puts] == ["9/2"] and timeout == {"timeoutMs": 6000}
