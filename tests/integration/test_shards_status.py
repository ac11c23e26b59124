"""`GET /api/v1/status` and `tailguard status` with sharding on: two real Services (sharding.shards 2)
over one PostgreSQL journal and the Kubernetes emulator's Leases. Asked of either replica, status lists
both shards with the replica leading each (as the Leases and the journal's terms say), the targets each
owns and, per target, its leader and the journal's state (a decision taken by the other replica shows
on both). When one replica stops, the other's status shows it leading both shards under new terms."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest

from daemon.cluster.shard_assignment import shard_of
from daemon.wiring.cli import main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.kube.emulator import KubeEmulator
from tests.support.helpers import NotifySink, local_settings, notify_policy, payload_with, post_alerts, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from tests.support.kube_helpers import kube_settings, write_kubeconfig

pytestmark = pytest.mark.integration

SHARDS = 2
MODELS = [f"m{i}" for i in range(6)]
LEASE = {"enabled": True, "leaseName": "tailguard", "leaseNamespace": "tailguard", "leaseDurationSeconds": 1.5,
         "renewDeadlineSeconds": 1.0, "retryPeriodSeconds": 0.2}
SETTLE_WAIT = 10 * (LEASE["leaseDurationSeconds"] + 5 * (LEASE["retryPeriodSeconds"] + LEASE["renewDeadlineSeconds"]))
"""Bound on the shards settling: the Lease duration and five rounds (a round waits retryPeriod, then runs
for at most renewDeadline), ten times over for a whole-suite CI run on 2 cores, where these Services
share this test's event loop and the cores with everything else."""
READER = "reader-token-3c9d1e7f"


@pytest.fixture(autouse=True)
def api_tokens_env() -> Iterator[None]:
    os.environ["TAILGUARD_API_TOKENS"] = f"- {{name: dashboards, token: {READER}, scopes: [read]}}\n"
    yield
    os.environ.pop("TAILGUARD_API_TOKENS", None)


def _policies(url: str) -> str:
    return "\n---\n".join(notify_policy(url).replace("name: ranker-notify", f"name: notify-{m}")
                          .replace("model: ranker", f"model: {m}") for m in MODELS)


def _settled(services: list[Service]) -> bool:
    led = [s.shards.led if s.shards is not None else frozenset() for s in services]
    return sum(len(x) for x in led) == SHARDS and frozenset().union(*led) == frozenset(range(SHARDS)) and all(led)


async def _status(svc: Service) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{svc.port}/api/v1/status",
                            headers={"Authorization": f"Bearer {READER}"}) as resp:
            assert resp.status == 200, await resp.text()
            return dict(json.loads(await resp.text()))


def _holders(emulator: KubeEmulator) -> dict[int, str | None]:
    return {s: emulator.get("leases", "tailguard", f"tailguard-shard-{s}")["spec"].get("holderIdentity")
            for s in range(SHARDS)}


async def test_status_of_either_replica_lists_every_shard_with_its_leader(
        tmp_path: Path, kube_emulator: KubeEmulator, postgres_dsn: str,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator)
    services: list[Service] = []
    async with NotifySink() as sink:
        pol = tmp_path / "policies"
        pol.mkdir()
        (pol / "p.yaml").write_text(_policies(sink.url))
        for name in ("a", "b"):
            settings = local_settings(tmp_path / name, pol, kubernetes=kube_settings(kubeconfig), leaderElection=LEASE,
                                      journal={"backend": "postgres", "dsn": postgres_dsn, "sharedPollSeconds": 0.2},
                                      sharding={"shards": SHARDS})
            svc = Service(settings, action_registry(), detector_registry())
            svc.identity = f"tailguard-{name}"
            await svc.start()
            services.append(svc)
        try:
            await wait_for(lambda: _settled(services), timeout=SETTLE_WAIT)
            # One alert, sent to the replica that does not lead its target: acted on by the other.
            model = MODELS[0]
            leader_of_model = next(s for s in services if s.shards is not None
                                   and s.shards.owns(f"default/{model}"))
            other = next(s for s in services if s is not leader_of_model)
            await post_alerts(other, payload_with(model=model, fingerprint="fp-status"), expect=200)
            await wait_for(lambda: len(sink.received) == 1, timeout=20)
            await wait_for(lambda: bool(leader_of_model.journal.decisions.all())
                           and leader_of_model.journal.decisions.all()[-1].state.final, timeout=20)

            holders = _holders(kube_emulator)
            assert set(holders.values()) == {"tailguard-a", "tailguard-b"}
            docs = {svc.identity: await _status(svc) for svc in services}
            for asked, doc in docs.items():
                sharding = doc["sharding"]
                assert doc["replica"] == asked
                assert sharding["shards"] == SHARDS and sharding["replicas"] == ["tailguard-a", "tailguard-b"]
                rows = sharding["items"]
                assert {r["shard"]: r["leader"] for r in rows} == holders, (asked, rows)
                assert all(r["state"] == "led" and r["termHolder"] == r["leader"] and r["term"] >= 1 for r in rows)
                assert {r["shard"] for r in rows if r["ledHere"]} == {s for s, h in holders.items() if h == asked}
                assert sorted(t for r in rows for t in r["targets"]) == sorted(f"default/{m}" for m in MODELS)
                for t in doc["targets"]:  # each target with its shard's leader, and the shared journal's state
                    assert t["leader"] == holders[shard_of(t["target"], SHARDS)]
                    if t["target"] == f"default/{model}":
                        assert t["leader"] == leader_of_model.identity
                        assert t["lastDecision"]["state"] == "succeeded", t
                        assert t["policies"][0]["actionsInWindow"] == 1
            # the same picture wherever asked (but for the answering replica's own fields)
            assert ([(r["shard"], r["leader"], r["term"], r["targets"]) for r in docs["tailguard-a"]["sharding"]["items"]]
                    == [(r["shard"], r["leader"], r["term"], r["targets"]) for r in docs["tailguard-b"]["sharding"]["items"]])

            # The CLI prints the shards table from whichever replica it asks.
            token_file = tmp_path / "token"
            token_file.write_text(READER)
            assert await asyncio.to_thread(main, ["status", "--url", f"http://127.0.0.1:{other.port}",
                                                  "--token-file", str(token_file)]) == 0
            table = capsys.readouterr().out
            assert f"shards: {SHARDS} across 2 replicas (tailguard-a, tailguard-b)" in table
            shard_lines = [line.split() for line in table.splitlines()
                           if line.split()[:1] and line.split()[0] in {str(s) for s in range(SHARDS)}]
            assert {int(cells[0]): cells[1] for cells in shard_lines} == holders

            # One replica stops (handing its shards back): the survivor shows itself leading both.
            before = {r["shard"]: r["term"] for r in docs["tailguard-a"]["sharding"]["items"]}
            leaving = services.pop(0)
            moved = {s for s, h in holders.items() if h == leaving.identity}
            await leaving.stop()
            survivor = services[0]
            await wait_for(lambda: _settled(services), timeout=SETTLE_WAIT)
            doc = await _status(survivor)
            rows = {r["shard"]: r for r in doc["sharding"]["items"]}
            assert all(r["leader"] == survivor.identity and r["state"] == "led" for r in rows.values()), rows
            assert doc["sharding"]["replicas"] == [survivor.identity]
            for s in moved:
                assert rows[s]["term"] == before[s] + 1
        finally:
            for svc in services:
                await svc.stop()
