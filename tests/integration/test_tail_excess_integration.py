"""Issue evidence for tail_excess on real Triton: the daemon reads Triton's own counters every
second (`source: triton`), flags a bad deploy (v2 sends 1% of requests down a 900 ms path) with
the version that carries it, and rolls back; a healthy deploy watched the same way, at the same
time (its model load holds requests for a moment), produces no signal in its first 40 s."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.load import run_load
from lab.triton import load_version, served_versions
from tests.support.helpers import local_settings, stop_load_after

pytestmark = pytest.mark.integration

POLICY = """
name: {name}-tail
target:
  model: {name}
  triton: {{endpoints: ["{url}"], metricsEndpoints: ["{metrics}"]}}
triggers:
  - detector:
      type: tail_excess
      source: triton
      query: nv_inference_compute_infer_duration_us{{model="$model"}}
      companionQuery: nv_inference_request_success{{model="$model"}}
      interval: 1s
      params: {{line: 500000}}
actions:
  - type: triton.rollback
    to: previous
    requireAttribution: true
guards: {{cooldown: 10m}}
"""
LOAD_SECONDS = 100.0
"""The bound on the whole run; the traffic stops once the bad deploy is rolled back and the healthy
one has been watched for HEALTHY_WATCH_SECONDS."""
BASELINE_SECONDS = 20.0
HEALTHY_WATCH_SECONDS = 40.0


async def test_counters_flag_a_bad_deploy_and_leave_a_healthy_deploy_alone(
        tmp_path: Path, triton_factory, prometheus_factory):
    bad = await triton_factory(name="ranker", slow_fraction_by_version={1: 0.0, 2: 0.01}, slow_ms=900,
                               fast_ms=3, instances=2)
    good = await triton_factory(name="scorer", slow_fraction_by_version={1: 0.0, 2: 0.0}, fast_ms=3,
                                instances=2)
    await asyncio.gather(load_version(bad, "ranker", 1), load_version(good, "scorer", 1))
    prom = await prometheus_factory(scrape_targets={"triton": [bad.metrics_target]}, scrape_interval="5s")
    pol = tmp_path / "policies"
    pol.mkdir()
    for name, server in (("ranker", bad), ("scorer", good)):
        (pol / f"{name}.yaml").write_text(POLICY.format(name=name, url=server.base_url,
                                                        metrics=server.metrics_url))
    settings = local_settings(tmp_path, pol, prometheus={"url": prom.url, "timeoutSeconds": 5})

    async with Service(settings, action_registry(), detector_registry()) as svc:
        load = [asyncio.ensure_future(run_load(server.base_url, model=name, rate_per_second=40,
                                               duration_seconds=LOAD_SECONDS))
                for name, server in (("ranker", bad), ("scorer", good))]
        await asyncio.sleep(BASELINE_SECONDS)
        assert await svc.journal.decisions.all.in_thread() == []
        await asyncio.gather(load_version(bad, "ranker", None), load_version(good, "scorer", None))  # the deploys
        assert served_versions(bad, "ranker") == ["2"] and served_versions(good, "scorer") == ["2"]

        async def rolled_back() -> bool:
            return any(d.policy == "ranker-tail" for d in await svc.journal.decisions.all.in_thread())

        clock = asyncio.get_running_loop().time
        deployed = clock()
        deadline = deployed + LOAD_SECONDS - BASELINE_SECONDS - 5
        while not await rolled_back():
            assert clock() < deadline, \
                [e for e in await svc.journal.evaluations.all.in_thread() if e.policy == "ranker-tail"][-5:]
            await asyncio.sleep(0.5)
        await stop_load_after(load, deployed, HEALTHY_WATCH_SECONDS)
        await svc.drain()
        decisions = await svc.journal.decisions.all.in_thread()
        evaluations = await svc.journal.evaluations.all.in_thread()
        signals = await svc.journal.signals.all.in_thread()

    assert [d.policy for d in decisions][:1] == ["ranker-tail"], [(d.policy, d.reason) for d in decisions]
    assert decisions[0].state == "succeeded", decisions[0].reason
    assert served_versions(bad, "ranker") == ["1"]
    assert served_versions(good, "scorer") == ["2"]
    fired = [s.payload for s in signals if s.payload.get("policy") == "ranker-tail"]
    assert fired and fired[0]["labels"]["version"] == "2", fired[:1]
    # The start test's episode begins at v2's first request: at or after its series' first sample.
    assert fired[0]["details"]["episode_start"] >= fired[0]["details"]["series_first_seen"]
    scorer = [e for e in evaluations if e.policy == "scorer-tail"]
    assert scorer and not any(e.fired for e in scorer), [e for e in scorer if e.fired][:3]
