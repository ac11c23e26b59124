"""Two real Services with sharding on (sharding.shards 4) over one PostgreSQL journal and the
Kubernetes emulator's Leases: webhooks land on either replica, each signal is acted on once, by the
replica leading its target's shard; when one replica stops, the other leads every shard and acts on
what is sent next. A replica leading no shard of a target leaves its signals pending in the journal."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from daemon.cluster.shard_assignment import shard_of
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.kube.emulator import KubeEmulator
from tests.support.helpers import NotifySink, local_settings, notify_policy, payload_with, post_alerts, wait_for
from tests.support.kube.conftest_plugin import kube_emulator  # noqa: F401  (fixture)
from tests.support.kube_helpers import kube_settings, write_kubeconfig

pytestmark = pytest.mark.integration

SHARDS = 4
MODELS = [f"m{i}" for i in range(8)]
LEASE = {"enabled": True, "leaseName": "tailguard", "leaseNamespace": "tailguard", "leaseDurationSeconds": 1.5,
         "renewDeadlineSeconds": 1.0, "retryPeriodSeconds": 0.2}
SETTLE_WAIT = 10 * (LEASE["leaseDurationSeconds"] + 5 * (LEASE["retryPeriodSeconds"] + LEASE["renewDeadlineSeconds"]))
"""Bound on the shards settling: the Lease duration and five rounds (a round waits retryPeriod, then runs
for at most renewDeadline), ten times over for a whole-suite CI run on 2 cores, where these Services
share this test's event loop and the cores with everything else."""


def _policies(url: str) -> str:
    docs = [notify_policy(url).replace("name: ranker-notify", f"name: notify-{m}").replace("model: ranker", f"model: {m}")
            for m in MODELS]
    return "\n---\n".join(docs)


def _settled(services: list[Service]) -> bool:
    """Every shard led once and each replica at its fair share: the bounded-load assignment's end
    state (a replica over its share hands shards back, which would move them mid-test)."""
    led = [s.shards.led if s.shards is not None else frozenset() for s in services]
    fair = -(-SHARDS // len(services))
    return (sum(len(x) for x in led) == SHARDS and frozenset().union(*led) == frozenset(range(SHARDS))
            and all(led) and max(len(x) for x in led) <= fair)


async def test_webhooks_on_any_replica_are_acted_on_once_by_the_shards_leader(
        tmp_path: Path, kube_emulator: KubeEmulator, postgres_dsn: str) -> None:  # noqa: F811
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
            acting: dict[str, list[str]] = {s.identity: [] for s in services}
            for svc in services:  # who decides what: each executor's signals, by model
                original = svc.executor.process

                async def process(signal_id: int, signal, svc: Service = svc, original=original):  # type: ignore[no-untyped-def]
                    # Whether this replica led the target's shard when it began to decide: a shard
                    # handed on mid-decision is the journal's fence's to judge, not a wrong actor.
                    assert svc.shards is not None
                    led = shard_of(f"default/{signal.labels['model']}", SHARDS) in svc.shards.led
                    plans = await original(signal_id, signal)
                    if plans:  # acted on
                        acting[svc.identity].append(signal.labels["model"] + ("" if led else " (not led)"))
                    return plans

                svc.executor.process = process  # type: ignore[method-assign]
                svc.backlog._process = process  # the backlog holds the bound method it was given
            # Each alert lands on one replica, alternating: half of them on a replica that does not lead it.
            for i, model in enumerate(MODELS):
                answer = await post_alerts(services[i % 2], payload_with(model=model, fingerprint=f"fp-{model}",
                                                                         starts_at="2026-11-29T18:00:00Z"))
                assert answer.status == 200
            await wait_for(lambda: len(sink.received) >= len(MODELS), timeout=20)
            await asyncio.sleep(1.0)  # nothing more comes: none acted on twice
            assert sorted(p["signal"]["labels"]["model"] for p in sink.received) == sorted(MODELS)
            assert not [m for ms in acting.values() for m in ms if m.endswith("(not led)")], acting
            assert sorted(m for ms in acting.values() for m in ms) == sorted(MODELS)
            assert all(acting.values())  # both replicas acted: the work follows the shards
            # One replica stops (handing its shards back): the other leads all and acts on the next alert.
            leaving = services.pop(0)
            await leaving.stop()
            await wait_for(lambda: _settled(services), timeout=SETTLE_WAIT)
            answer = await post_alerts(services[0], payload_with(model=MODELS[0], fingerprint="fp-after",
                                                                 starts_at="2026-11-29T18:10:00Z"))
            assert answer.status == 200
            await wait_for(lambda: len(sink.received) == len(MODELS) + 1, timeout=20)
        finally:
            for svc in services:
                await svc.stop()
