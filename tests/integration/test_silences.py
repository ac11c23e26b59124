"""Alertmanager silences before acting on a detector signal, with a real Alertmanager: a silence made
through its API v2 that matches the target's labels blocks the action (journaled as silenced, not
counted for cooldown); a target no silence matches is acted on; an Alertmanager that is down does
not hold remediation back (acted, and the decision records that silences were not checked)."""
from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.ports import free_port
from lab.prometheus import BackfillSeries, backfill_openmetrics
from tests.support.helpers import NotifySink, local_settings, wait_for

pytestmark = pytest.mark.integration

OFFSET = 3600.0  # the daemon's clock runs an hour back, so backfilled history ends at its "now"
POLICY = """
name: {model}-tail
target: {{model: {model}}}
triggers:
  - detector:
      type: threshold
      query: max by (model) (p999_us{{model="$model"}})
      interval: 1s
      params: {{threshold: 500000}}
actions:
  - type: notify
    url: {url}
"""


async def _incident_prometheus(tmp_path: Path, prometheus_factory: Any, models: list[str]) -> Any:
    now0 = time.time() - OFFSET
    samples = [(now0 - 600 + 15 * i, 200_000.0 if i < 30 else 900_000.0) for i in range(61)]
    data = tmp_path / "tsdb"
    backfill_openmetrics(data, [BackfillSeries("p999_us", samples, {"model": m}) for m in models])
    return await prometheus_factory(scrape_targets={}, data_dir=data)


def _create_silence(am_url: str, matchers: list[dict[str, Any]], comment: str) -> str:
    now = datetime.now(timezone.utc)
    body = {"matchers": matchers, "startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat(),
            "createdBy": "tester", "comment": comment}
    req = urllib.request.Request(f"{am_url}/api/v2/silences", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return str(json.load(resp)["silenceID"])


def _policies(tmp_path: Path, url: str, models: list[str]) -> Path:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    for model in models:
        (pol / f"{model}.yaml").write_text(POLICY.format(model=model, url=url))
    return pol


async def test_matching_silence_blocks_and_others_act(tmp_path: Path, prometheus_factory, alertmanager_factory):
    """ranker is silenced (a regex matcher plus an equality one), scorer is not: only scorer's
    notification goes out; ranker's decision is blocked, names the silence, and is not executed."""
    models = ["ranker", "scorer"]
    prom = await _incident_prometheus(tmp_path, prometheus_factory, models)
    am = await alertmanager_factory(f"http://127.0.0.1:{free_port()}/hook")
    silence_id = _create_silence(am.url, [
        {"name": "model", "value": "rank.*", "isRegex": True, "isEqual": True},
        {"name": "model", "value": "scorer", "isRegex": False, "isEqual": False},
    ], "node upgrades")
    async with NotifySink() as sink:
        settings = local_settings(tmp_path, _policies(tmp_path, sink.url, models), prometheus={"url": prom.url},
                                  alertmanager={"url": am.url})
        async with Service(settings, action_registry(), detector_registry(),
                           clock=lambda: time.time() - OFFSET) as svc:
            await wait_for(lambda: len(svc.journal.decisions.all()) >= 2, timeout=30)
            await svc.drain()
            decisions = {d.policy: d for d in await svc.journal.decisions.all.in_thread()}
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{svc.port}/metrics") as resp:
                    metrics = await resp.text()
    assert [n["signal"]["labels"]["model"] for n in sink.received] == ["scorer"]
    ranker, scorer = decisions["ranker-tail"], decisions["scorer-tail"]
    assert ranker.state == "blocked" and not ranker.executed
    assert ranker.reason.startswith(f"silenced in Alertmanager: silence {silence_id} by tester")
    assert "node upgrades" in ranker.reason
    assert ranker.plan["silences"]["checked"] and ranker.plan["silences"]["matched"]
    assert scorer.state == "succeeded" and scorer.plan["silences"] == {"checked": True, "matched": []}
    assert 'tailguard_silence_checks_total{result="silenced"} 1.0' in metrics
    assert 'tailguard_silence_checks_total{result="clear"} 1.0' in metrics
    # The detector gauges of the same cycle (part of issue 11: values and thresholds in /metrics).
    assert ('tailguard_detector_fired{detector="threshold",policy="scorer-tail",series="model=scorer",'
            'trigger="0"} 1.0') in metrics
    assert ('tailguard_detector_threshold{detector="threshold",policy="ranker-tail",series="model=ranker",'
            'trigger="0"} 500000.0') in metrics


async def test_alertmanager_down_does_not_block(tmp_path: Path, prometheus_factory):
    """Nothing listens at alertmanager.url: the daemon acts and records why silences were not checked."""
    prom = await _incident_prometheus(tmp_path, prometheus_factory, ["ranker"])
    async with NotifySink() as sink:
        settings = local_settings(tmp_path, _policies(tmp_path, sink.url, ["ranker"]), prometheus={"url": prom.url},
                                  alertmanager={"url": f"http://127.0.0.1:{free_port()}", "timeoutSeconds": 0.5})
        async with Service(settings, action_registry(), detector_registry(),
                           clock=lambda: time.time() - OFFSET) as svc:
            await wait_for(lambda: len(sink.received) == 1, timeout=30)
            await svc.drain()
            (decision,) = await svc.journal.decisions.all.in_thread()
    assert decision.state == "succeeded" and decision.executed
    assert decision.plan["silences"]["checked"] is False and decision.plan["silences"]["error"]
