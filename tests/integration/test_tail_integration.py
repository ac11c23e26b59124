"""Issue evidence: real Prometheus scraping real Triton; after a bad deploy (v2 sends a few requests
down a slow path) the daemon's own poller flags the P99.9 tail and rolls back to v1. A healthy
deploy watched the same way, at the same time, produces no signal."""
from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

from tritonclient.http.aio import InferenceServerClient

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.load import run_load
from lab.triton import TritonServer
from tests.support.helpers import local_settings

POLICY = """
name: {name}-tail
target:
  model: {name}
  triton: {{endpoints: ["{url}"]}}
triggers:
  - detector:
      type: tail_anomaly
      # max over versions: a new version's series has no history of its own
      query: max by (model) (nv_inference_request_summary_us{{model="$model", quantile="0.999"}})
      companionQuery: max by (model) (nv_inference_request_summary_us{{model="$model", quantile="0.99"}})
      interval: 1s
      params:
        min_absolute_increase: 100000   # 100 ms, in Triton's microseconds
        baseline_window_seconds: 20
        evaluation_window_seconds: 8
        min_baseline_points: 8
        max_staleness_seconds: 10
actions:
  - type: triton.rollback
    to: previous
guards: {{cooldown: 10m}}
"""
LOAD_SECONDS = 75.0
BASELINE_SECONDS = 30.0


def _served(server: TritonServer, model: str) -> list[str]:
    req = urllib.request.Request(f"{server.base_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return sorted(e["version"] for e in json.load(resp) if e.get("name") == model and e.get("state") == "READY")


async def _pin(server: TritonServer, model: str, version: int | None) -> None:
    """Serve `version` pinned, or (None) reload from disk: the newest version, as a deploy does."""
    client = InferenceServerClient(server.http_url, conn_timeout=60)
    try:
        if version is None:
            await client.load_model(model)
        else:
            config = await client.get_model_config(model)
            config["version_policy"] = {"specific": {"versions": [version]}}
            await client.load_model(model, config=json.dumps(config))
    finally:
        await client.close()


async def test_poller_flags_bad_deploy_and_rolls_back_healthy_one_untouched(
        tmp_path: Path, triton_factory, prometheus_factory):
    bad = await triton_factory(name="ranker", slow_fraction_by_version={1: 0.0, 2: 0.03}, slow_ms=600,
                               fast_ms=3, instances=2)
    good = await triton_factory(name="scorer", slow_fraction_by_version={1: 0.0, 2: 0.0}, fast_ms=3,
                                instances=2)
    await asyncio.gather(_pin(bad, "ranker", 1), _pin(good, "scorer", 1))
    prom = await prometheus_factory(scrape_targets={"triton": [bad.metrics_target, good.metrics_target]},
                                    scrape_interval="1s")
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "ranker.yaml").write_text(POLICY.format(name="ranker", url=bad.base_url))
    (pol / "scorer.yaml").write_text(POLICY.format(name="scorer", url=good.base_url))
    settings = local_settings(tmp_path, pol, prometheus={"url": prom.url, "timeoutSeconds": 5})

    async with Service(settings, action_registry(), detector_registry()) as svc:
        load = asyncio.gather(
            run_load(bad.base_url, model="ranker", rate_per_second=25, duration_seconds=LOAD_SECONDS),
            run_load(good.base_url, model="scorer", rate_per_second=25, duration_seconds=LOAD_SECONDS))
        await asyncio.sleep(BASELINE_SECONDS)  # healthy history for the baseline
        assert await svc.journal.decisions() == []
        await asyncio.gather(_pin(bad, "ranker", None), _pin(good, "scorer", None))  # the deploy
        assert _served(bad, "ranker") == ["2"] and _served(good, "scorer") == ["2"]

        async def rolled_back() -> bool:
            return any(d.policy == "ranker-tail" for d in await svc.journal.decisions())

        deadline = asyncio.get_running_loop().time() + LOAD_SECONDS - BASELINE_SECONDS
        while not await rolled_back():
            assert asyncio.get_running_loop().time() < deadline, await svc.journal.evaluations()
            await asyncio.sleep(0.5)
        await svc.drain()
        await load
        decisions = await svc.journal.decisions()
        evaluations = await svc.journal.evaluations()

    # Only the bad deploy is acted on, once; the healthy one produced no signal. A later episode of
    # the same tail (the summary quantile dips and rises again while the slow requests age out of
    # its window, docs/stack-facts.md) is a new signal, and the cooldown blocks it.
    assert all(d.policy == "ranker-tail" for d in decisions), [(d.policy, d.state) for d in decisions]
    assert all(d.state == "blocked" and d.reason.startswith("cooldown") for d in decisions[1:]), \
        [(d.state, d.reason) for d in decisions]
    decision = decisions[0]
    assert decision.policy == "ranker-tail" and decision.state == "succeeded", decision.reason
    assert decision.plan["steps"][0]["after"]["version"] == 1
    assert _served(bad, "ranker") == ["1"]
    assert _served(good, "scorer") == ["2"]
    scorer = [e for e in evaluations if e["policy"] == "scorer-tail"]
    assert scorer and not any(e["fired"] for e in scorer), scorer
