"""End to end against the real Triton server: an Alertmanager webhook rolls ranker back to v1."""
from __future__ import annotations

from pathlib import Path

import pytest

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.policies import rollback_policy
from lab.ports import free_port
from lab.triton import TritonServer, served_versions
from tests.support.helpers import local_settings, payload_with, post_alerts, sample_payload


def _write_policy(tmp_path: Path, url: str, dry: bool = False) -> Path:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "ranker.yaml").write_text(rollback_policy(url, guards=f"cooldown: 0s, dryRun: {str(dry).lower()}"))
    return pol


@pytest.mark.integration
async def test_webhook_rolls_triton_back_to_v1_and_journals_it(tmp_path: Path, triton_server: TritonServer):
    """The real Alertmanager payload -> policy -> triton.rollback: Triton serves only v1 after,
    and the journal holds the alert, the plan and the outcome; a second alert is a no-op."""
    assert served_versions(triton_server) == ["2"]
    pol = _write_policy(tmp_path, triton_server.base_url)
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        assert (await post_alerts(svc, sample_payload())).status == 200
        await svc.drain()
        assert served_versions(triton_server) == ["1"]
        (signal,) = await svc.journal.signals.all.in_thread()
        assert signal.payload["labels"]["model"] == "ranker"
        (decision,) = await svc.journal.decisions.all.in_thread()
        assert decision.state == "succeeded", decision.reason
        (step,) = decision.plan["steps"]
        assert step["after"]["version"] == 1 and step["action"] == "triton.rollback"
        phases = [(s.phase, s.status) for s in await svc.journal.decisions.steps.in_thread(decision.id)
                  if s.phase != "recovery"]  # the required verify block's check: irrelevant here
        assert phases == [("intent", "pending"), ("apply", "ok"), ("verify", "ok")]
        assert (await svc.journal.pins.live.in_thread())[0].version == 1

        # Idempotent: rolling back what is already rolled back does nothing.
        assert (await post_alerts(svc, payload_with(starts_at="2026-11-29T17:40:00Z"))).status == 200
        await svc.drain()
        second = (await svc.journal.decisions.all.in_thread())[-1]
        assert second.state == "noop" and "nothing to do" in second.reason
        assert served_versions(triton_server) == ["1"]


@pytest.mark.integration
async def test_dry_run_plans_and_changes_nothing(tmp_path: Path, triton_server: TritonServer):
    """dryRun journals the plan (pin to v1) and leaves Triton serving v2."""
    pol = _write_policy(tmp_path, triton_server.base_url, dry=True)
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        assert (await post_alerts(svc, sample_payload())).status == 200
        await svc.drain()
        (decision,) = await svc.journal.decisions.all.in_thread()
    assert decision.state == "dry_run"
    assert decision.plan["steps"][0]["after"]["version"] == 1
    assert served_versions(triton_server) == ["2"]


async def test_triton_down_is_a_recorded_failure_not_a_crash(tmp_path: Path):
    """A Triton that does not answer gives a failed decision with the reason; the daemon lives on."""
    pol = _write_policy(tmp_path, f"http://127.0.0.1:{free_port()}")
    async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
        assert (await post_alerts(svc, sample_payload())).status == 200
        await svc.drain()
        (decision,) = await svc.journal.decisions.all.in_thread()
        assert decision.state == "failed"
        assert "no reachable Triton replica" in decision.reason
        assert (await post_alerts(svc, payload_with(starts_at="2026-11-29T18:00:00Z"))).status == 200
        await svc.drain()
        assert len(await svc.journal.decisions.all.in_thread()) == 2
