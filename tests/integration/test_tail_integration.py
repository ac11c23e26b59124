"""Issue evidence: real Prometheus scraping real Triton; after a bad deploy (v2 sends a few requests
down a slow path) the daemon's own poller flags the P99.9 tail and rolls back to v1. A healthy
deploy watched the same way, at the same time, produces no signal."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.load import run_load
from lab.policies import TAIL_ANOMALY_TRIGGER, rollback_policy
from lab.triton import load_version, served_versions
from tests.support.helpers import local_settings, stop_load_after

pytestmark = pytest.mark.integration

LOAD_SECONDS = 75.0
"""The bound on the whole run; the traffic stops once the bad deploy is rolled back and the healthy
one has been watched for HEALTHY_WATCH_SECONDS."""
BASELINE_SECONDS = 30.0
HEALTHY_WATCH_SECONDS = 30.0


async def test_poller_flags_bad_deploy_and_rolls_back_healthy_one_untouched(
        tmp_path: Path, triton_factory, prometheus_factory):
    bad = await triton_factory(name="ranker", slow_fraction_by_version={1: 0.0, 2: 0.03}, slow_ms=600,
                               fast_ms=3, instances=2)
    good = await triton_factory(name="scorer", slow_fraction_by_version={1: 0.0, 2: 0.0}, fast_ms=3,
                                instances=2)
    await asyncio.gather(load_version(bad, "ranker", 1), load_version(good, "scorer", 1))
    prom = await prometheus_factory(scrape_targets={"triton": [bad.metrics_target, good.metrics_target]},
                                    scrape_interval="1s")
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "ranker.yaml").write_text(rollback_policy(bad.base_url, model="ranker", triggers=TAIL_ANOMALY_TRIGGER, verify=""))
    (pol / "scorer.yaml").write_text(rollback_policy(good.base_url, model="scorer", triggers=TAIL_ANOMALY_TRIGGER, verify=""))
    settings = local_settings(tmp_path, pol, prometheus={"url": prom.url, "timeoutSeconds": 5})

    async with Service(settings, action_registry(), detector_registry()) as svc:
        load = [asyncio.ensure_future(run_load(server.base_url, model=name, rate_per_second=25,
                                               duration_seconds=LOAD_SECONDS))
                for name, server in (("ranker", bad), ("scorer", good))]
        await asyncio.sleep(BASELINE_SECONDS)  # healthy history for the baseline
        assert await svc.journal.decisions.all.in_thread() == []
        await asyncio.gather(load_version(bad, "ranker", None), load_version(good, "scorer", None))  # the deploy
        assert served_versions(bad, "ranker") == ["2"] and served_versions(good, "scorer") == ["2"]

        async def rolled_back() -> bool:
            return any(d.policy == "ranker-tail" for d in await svc.journal.decisions.all.in_thread())

        clock = asyncio.get_running_loop().time
        deployed = clock()
        deadline = deployed + LOAD_SECONDS - BASELINE_SECONDS
        while not await rolled_back():
            assert clock() < deadline, await svc.journal.evaluations.all.in_thread()
            await asyncio.sleep(0.5)
        await stop_load_after(load, deployed, HEALTHY_WATCH_SECONDS)
        await svc.drain()
        decisions = await svc.journal.decisions.all.in_thread()
        evaluations = await svc.journal.evaluations.all.in_thread()

    # Only the bad deploy is acted on, once; the healthy one produced no signal. A later episode of
    # the same tail (the summary quantile dips and rises again while the slow requests age out of
    # its window, docs/stack-facts.md) is a new signal, and the cooldown blocks it.
    assert all(d.policy == "ranker-tail" for d in decisions), [(d.policy, d.state) for d in decisions]
    assert all(d.state == "blocked" and d.reason.startswith("cooldown") for d in decisions[1:]), \
        [(d.state, d.reason) for d in decisions]
    decision = decisions[0]
    assert decision.policy == "ranker-tail" and decision.state == "succeeded", decision.reason
    assert decision.plan["steps"][0]["after"]["version"] == 1
    assert served_versions(bad, "ranker") == ["1"]
    assert served_versions(good, "scorer") == ["2"]
    scorer = [e for e in evaluations if e.policy == "scorer-tail"]
    assert scorer and not any(e.fired for e in scorer), scorer
