"""A journal outage mid-decision, for real: the daemon's PostgreSQL journal behind a TCP proxy the
test controls, the real Triton behind another. The moment the rollback's load reaches Triton, the
journal goes away for a few seconds (every connection cut, new ones refused), so the load lands
and its result cannot be journaled. The worker retries with backoff while the journal is away (it
is not parked until a restart); once it is back, the decision resumes from the journal, re-observes
the landed load, records it (no second load), verifies, pins, and ends succeeded."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.fault_proxy import FaultProxy, FaultProxyThread
from lab.policies import rollback_policy
from lab.triton import TritonServer, served_versions
from tests.support.helpers import local_settings, post_alerts, sample_payload, wait_for
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.integration

LOAD = b"/v2/repository/models/ranker/load"
JOURNAL_AWAY_SECONDS = 18.0
"""How long the journal stays away after the load has landed: long enough that the write of the
load's result fails, not waits. Two writes follow the load, each waiting up to the pool's 5 s for a
connection (and for the journal's lock behind another write's wait): the door's result row
(daemon/workers/door.py), then the step's result, which must fail for the resume to be tested. Counted from the landing, not
from the request: on a busy machine the model load itself can outlast a fixed outage, and the
result would then be written normally, with no outage to recover from."""


@pytest.fixture
def journal_proxy(postgres_server: PostgresServer) -> Iterator[FaultProxyThread]:
    """PostgreSQL behind a proxy on a thread of its own (the journal opens synchronously)."""
    proxy = FaultProxyThread("127.0.0.1", postgres_server.port).start()
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
async def triton_proxy(triton_server: TritonServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", triton_server.http_port) as proxy:
        yield proxy


async def test_the_journal_going_away_mid_decision_is_retried_and_the_landed_load_not_repeated(
        tmp_path: Path, postgres_dsn: str, journal_proxy: FaultProxyThread, triton_proxy: FaultProxy,
        triton_server: TritonServer) -> None:
    dsn = postgres_dsn.replace(f":{postgres_dsn.split(':')[-1].split('/')[0]}/", f":{journal_proxy.port}/")
    assert str(journal_proxy.port) in dsn
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "ranker.yaml").write_text(rollback_policy(triton_proxy.url, guards="cooldown: 0s"))
    settings = local_settings(tmp_path, policies, journal={"backend": "postgres", "dsn": dsn},
                              executor={"workers": 1, "pinReconcileIntervalSeconds": 3600})

    back: list[asyncio.Task[None]] = []

    def journal_away() -> None:
        journal_proxy.down()
        back.append(asyncio.get_running_loop().create_task(back_after_the_load()))

    async def back_after_the_load() -> None:
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while await asyncio.to_thread(served_versions, triton_server, "ranker") != ["1"]:
                assert asyncio.get_running_loop().time() < deadline, "the load never landed"
                await asyncio.sleep(0.1)
            await asyncio.sleep(JOURNAL_AWAY_SECONDS)
        finally:
            journal_proxy.up()

    async with Service(settings, action_registry(), detector_registry()) as svc:
        triton_proxy.on(LOAD, journal_away)  # as the load is sent: the journal goes away
        assert (await post_alerts(svc, sample_payload())).status == 200
        await wait_for(lambda: not journal_proxy.is_up, timeout=60)
        await wait_for(lambda: journal_proxy.is_up, timeout=60)
        await asyncio.wait_for(svc.drain(), timeout=90)
        await asyncio.gather(*back)  # the outage's own failure (the load never landed), if any
        (decision,) = await svc.journal.decisions.all.in_thread()
        rows = await svc.journal.decisions.steps.in_thread(decision.id)
        pins = await svc.journal.pins.live.in_thread()
        signals = await svc.journal.signals.all.in_thread()
        faults = svc.metrics.registry.get_sample_value("tailguard_faults_total", {"component": "journal"})

    assert decision.state == "succeeded", decision.reason
    assert triton_proxy.count(LOAD) == 1  # the landed load was recognised, not sent again
    assert await asyncio.to_thread(served_versions, triton_server, "ranker") == ["1"]
    applies = [r for r in rows if r.phase == "apply"]
    assert [a.data.get("recovered") for a in applies] == [True], applies
    assert [(p.version, p.from_version) for p in pins] == [(1, 2)]
    assert [s.state for s in signals] == ["processed"]
    assert faults is not None and faults >= 1
