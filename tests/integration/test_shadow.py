"""Shadow triggers: a trigger with `shadow: true` journals what it would have done (a decision whose
reason starts with "shadow"), never acts, and never counts toward the cooldown or rate limit of the
live triggers beside it on the same policy; it shows in status, `tailguard journal` and /metrics."""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core.signal import Signal, SignalSource
from daemon.wiring.cli import main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from daemon.workers.shadow import shadow_origin, trigger_index
from lab.prometheus import BackfillSeries, backfill_openmetrics
from policies.loader import load_policies
from tests.support.helpers import NotifySink, local_settings, payload_with, post_alerts, wait_for

ALERT_POLICY = """
name: ranker-notify
target: {{model: ranker}}
triggers:
  - alert: {{name: TailCandidate}}
    shadow: true
  - alert: {{name: TritonTailLatencyHigh}}
actions:
  - type: notify
    url: {url}
guards: {{cooldown: 1h, maxActions: 1, maxActionsWindow: 1h}}
# alert-only: a verify block is required; its outcome is irrelevant here (onNotRecovered: none)
verify: {{query: 'vector(0)', below: 1, onNotRecovered: none}}
"""

DETECTOR_POLICY = """
name: ranker-tail
target: {{model: ranker}}
triggers:
  - detector:
      type: threshold
      query: max by (model) (p999_us{{model="$model"}})
      interval: 1s
      params: {{threshold: 500000}}
  - detector:
      type: threshold
      query: max by (model) (p999_us{{model="$model"}})
      interval: 1s
      params: {{threshold: 300000}}
    shadow: true
actions:
  - type: notify
    url: {url}
guards: {{cooldown: 1h}}
"""


def _alert(name: str, starts_at: str) -> dict[str, Any]:
    body = copy.deepcopy(payload_with(starts_at=starts_at))
    body["alerts"][0]["labels"]["alertname"] = name
    body["alerts"][0]["fingerprint"] = f"{abs(hash(name)) % 10**12:012x}"
    return body


def _policy_dir(tmp_path: Path, text: str) -> Path:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "p.yaml").write_text(text)
    return pol


def test_shadow_origin_is_pure_and_fails_safe(tmp_path: Path):
    """The trigger index comes from the dedup key; a signal marked shadow stays shadow even when the
    index now names a live trigger; an alert is shadow only when every trigger it matches is."""
    policies = load_policies(_policy_dir(tmp_path, DETECTOR_POLICY.format(url="http://127.0.0.1:9/h")),
                             action_registry(), detector_registry())
    (policy,) = policies.policies

    def detector(idx: int, **details: Any) -> Signal:
        return Signal(SignalSource.DETECTOR, "threshold", {"model": "ranker"}, _now(),
                      f"detector:ranker-tail:{idx}:abc", policy="ranker-tail", details=details)

    assert trigger_index(detector(1)) == 1
    assert shadow_origin(policy, detector(0)) is None
    origin = shadow_origin(policy, detector(1))
    assert origin is not None and origin.index == 1 and origin.label.startswith("shadow trigger 1")
    assert shadow_origin(policy, detector(0, shadow=True)) is not None
    assert shadow_origin(policy, detector(7)) is None  # no such trigger, not marked: live as before


async def test_shadow_alert_beside_live_one_never_acts_nor_counts(tmp_path: Path):
    """Shadow alert first: journaled as "would apply", nothing sent; then the live alert acts (the
    shadow decision took no cooldown); then the shadow alert again: "would be blocked: cooldown"."""
    async with NotifySink() as sink:
        settings = local_settings(tmp_path, _policy_dir(tmp_path, ALERT_POLICY.format(url=sink.url)),
                                  api={"allowUnauthenticated": True})
        async with Service(settings, action_registry(), detector_registry()) as svc:
            await post_alerts(svc, _alert("TailCandidate", "2026-11-29T17:00:00Z"), expect=200, drain=True)
            assert sink.received == []
            await post_alerts(svc, _alert("TritonTailLatencyHigh", "2026-11-29T17:01:00Z"), expect=200, drain=True)
            assert len(sink.received) == 1
            await post_alerts(svc, _alert("TailCandidate", "2026-11-29T17:02:00Z"), expect=200, drain=True)
            decisions = await svc.journal.decisions.all.in_thread()
            last, count = await svc.journal.decisions.guard_history.in_thread("ranker-notify", "default/ranker", 3600, time.time())
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{svc.port}"
                async with http.get(base + "/api/v1/status") as resp:
                    status = await resp.json()
                async with http.get(base + "/metrics") as resp:
                    metrics = await resp.text()
    assert len(sink.received) == 1
    states = [(d.state, d.executed, d.reason.split(":")[0]) for d in decisions]
    assert states == [("dry_run", False, "shadow trigger 0 (alert TailCandidate)"),
                      ("succeeded", True, "1 step(s) applied and verified"),
                      ("blocked", False, "shadow trigger 0 (alert TailCandidate)")], states
    assert "would apply: notify" in decisions[0].reason and "not applied" in decisions[0].reason
    assert "would be blocked: cooldown" in decisions[2].reason
    assert decisions[0].plan["shadow"] == {"trigger": 0, "kind": "alert TailCandidate", "would": "act"}
    assert count == 1  # only the live action counts
    (target,) = status["targets"]
    assert target["lastDecision"]["reason"].startswith("shadow trigger 0")
    assert 'tailguard_shadow_decisions_total{policy="ranker-notify",would="act"} 1.0' in metrics
    assert 'tailguard_shadow_decisions_total{policy="ranker-notify",would="blocked"} 1.0' in metrics


@pytest.mark.integration
async def test_shadow_detector_beside_live_one(tmp_path: Path, prometheus_factory, capsys: pytest.CaptureFixture[str]):
    """Two detector triggers on one policy over real Prometheus data above both thresholds: the live
    one acts once, the shadow one (a lower threshold) is journaled and applies nothing; both show
    in `tailguard journal`."""
    offset = 3600.0
    now0 = time.time() - offset
    data = tmp_path / "tsdb"
    samples = [(now0 - 600 + 15 * i, 200_000.0 if i < 30 else 900_000.0) for i in range(61)]
    backfill_openmetrics(data, [BackfillSeries("p999_us", samples, {"model": "ranker"})])
    prom = await prometheus_factory(scrape_targets={}, data_dir=data)
    async with NotifySink() as sink:
        settings = local_settings(tmp_path, _policy_dir(tmp_path, DETECTOR_POLICY.format(url=sink.url)),
                                  prometheus={"url": prom.url})
        async with Service(settings, action_registry(), detector_registry(),
                           clock=lambda: time.time() - offset) as svc:
            await wait_for(lambda: len(svc.journal.decisions.all()) >= 2, timeout=30)
            await svc.drain()
            decisions = await svc.journal.decisions.all.in_thread()
            signals = await svc.journal.signals.all.in_thread()
    assert len(sink.received) == 1
    by_trigger = {d.plan.get("shadow", {}).get("trigger", "live"): d for d in decisions}
    assert set(by_trigger) == {"live", 1}, [(d.state, d.reason) for d in decisions]
    assert by_trigger["live"].state == "succeeded" and by_trigger["live"].executed
    shadow = by_trigger[1]
    assert not shadow.executed and shadow.reason.startswith("shadow trigger 1 (detector threshold)")
    assert any(s.payload["details"].get("shadow") for s in signals)
    capsys.readouterr()  # the daemon's own log lines
    assert main(["journal", str(settings.journal.path)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert any(p["reason"].startswith("shadow trigger 1") for p in printed)


def _now() -> Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)
