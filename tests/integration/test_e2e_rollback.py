"""End to end against the real Triton server: an Alertmanager webhook rolls ranker back to v1."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import aiohttp

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.ports import free_port
from lab.triton import TritonServer
from tests.support.helpers import TOKEN, local_settings, payload_with, sample_payload

POLICY = """
name: ranker-tail
target:
  model: ranker
  triton: {{endpoints: ["{url}"]}}
triggers:
  - alert: {{name: TritonTailLatencyHigh, matchers: {{severity: page}}}}
actions:
  - type: triton.rollback
    to: previous
guards: {{cooldown: 0s, dryRun: {dry}}}
# alert-only: a verify block is required; its outcome is irrelevant here (onNotRecovered: none)
verify: {{query: 'vector(0)', below: 1, onNotRecovered: none}}
"""


def _served(server: TritonServer) -> list[str]:
    req = urllib.request.Request(f"{server.base_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return sorted(e["version"] for e in json.load(resp) if e.get("state") == "READY")


def _write_policy(tmp_path: Path, url: str, dry: bool = False) -> Path:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "ranker.yaml").write_text(POLICY.format(url=url, dry=str(dry).lower()))
    return pol


async def _post(svc: Service, body: dict) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{svc.port}/api/v1/alerts", json=body,
                             headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            return resp.status


async def test_webhook_rolls_triton_back_to_v1_and_journals_it(tmp_path: Path, triton_server: TritonServer):
    """The real Alertmanager payload -> policy -> triton.rollback: Triton serves only v1 after,
    and the journal holds the alert, the plan and the outcome; a second alert is a no-op."""
    assert _served(triton_server) == ["2"]
    pol = _write_policy(tmp_path, triton_server.base_url)
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        assert await _post(svc, sample_payload()) == 200
        await svc.drain()
        assert _served(triton_server) == ["1"]
        (signal,) = await svc.journal.signals()
        assert signal["payload"]["labels"]["model"] == "ranker"
        (decision,) = await svc.journal.decisions()
        assert decision.state == "succeeded", decision.reason
        (step,) = decision.plan["steps"]
        assert step["after"]["version"] == 1 and step["action"] == "triton.rollback"
        phases = [(s["phase"], s["status"]) for s in await svc.journal.steps(decision.id)
                  if s["phase"] != "recovery"]  # the required verify block's check: irrelevant here
        assert phases == [("intent", "pending"), ("apply", "ok"), ("verify", "ok")]
        assert (await svc.journal.pins())[0]["version"] == 1

        # Idempotent: rolling back what is already rolled back does nothing.
        assert await _post(svc, payload_with(starts_at="2026-11-29T17:40:00Z")) == 200
        await svc.drain()
        second = (await svc.journal.decisions())[-1]
        assert second.state == "noop" and "nothing to do" in second.reason
        assert _served(triton_server) == ["1"]


async def test_dry_run_plans_and_changes_nothing(tmp_path: Path, triton_server: TritonServer):
    """dryRun journals the plan (pin to v1) and leaves Triton serving v2."""
    pol = _write_policy(tmp_path, triton_server.base_url, dry=True)
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        assert await _post(svc, sample_payload()) == 200
        await svc.drain()
        (decision,) = await svc.journal.decisions()
    assert decision.state == "dry_run"
    assert decision.plan["steps"][0]["after"]["version"] == 1
    assert _served(triton_server) == ["2"]


async def test_triton_down_is_a_recorded_failure_not_a_crash(tmp_path: Path):
    """A Triton that does not answer gives a failed decision with the reason; the daemon lives on."""
    pol = _write_policy(tmp_path, f"http://127.0.0.1:{free_port()}")
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        assert await _post(svc, sample_payload()) == 200
        await svc.drain()
        (decision,) = await svc.journal.decisions()
        assert decision.state == "failed"
        assert "no reachable Triton replica" in decision.reason
        assert await _post(svc, payload_with(starts_at="2026-11-29T18:00:00Z")) == 200
        await svc.drain()
        assert len(await svc.journal.decisions()) == 2
