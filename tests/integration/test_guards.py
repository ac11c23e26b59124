"""Guards: pure decisions, and cooldown / rate limit / freeze through the running daemon,
including across a restart on the same journal file."""
from __future__ import annotations

from pathlib import Path

from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from policies.guards import GuardState, check_guards
from policies.schema import Guards
from tests.support.helpers import NotifySink, local_settings, notify_policy, payload_with, post_alerts

def test_check_guards_order_and_reasons():
    """Freeze beats cooldown beats rate limit; each refusal says why."""
    g = Guards.model_validate({"cooldown": "10m", "maxActions": 2})
    assert check_guards(g, GuardState(None, 0), 1000).allowed
    assert "freeze" in check_guards(g, GuardState(None, 0, frozen=True), 1000).reason
    assert "cooldown" in check_guards(g, GuardState(900.0, 1), 1000).reason
    assert check_guards(g, GuardState(0.0, 1), 1000).allowed
    assert "rate limit" in check_guards(g, GuardState(0.0, 2), 1000).reason


def _policies(tmp_path: Path, url: str, cooldown: str = "1h", max_actions: int = 5) -> Path:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "p.yaml").write_text(notify_policy(url, f"cooldown: {cooldown}, maxActions: {max_actions}, maxActionsWindow: 1h"))
    return pol


async def test_cooldown_and_dedup_survive_a_restart(tmp_path: Path):
    """One action, then a new alert inside the cooldown is blocked; after a restart on the same
    journal the cooldown still holds and a resent alert is still a duplicate."""
    async with NotifySink() as sink:
        pol = _policies(tmp_path, sink.url)
        async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
            await post_alerts(svc, payload_with(starts_at="2026-11-29T17:00:00Z"), expect=200)
            await post_alerts(svc, payload_with(starts_at="2026-11-29T17:05:00Z"), expect=200)
            await svc.drain()
            states = [d.state for d in await svc.journal.decisions.all.in_thread()]
        assert states == ["succeeded", "blocked"]
        assert len(sink.received) == 1

        async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
            assert (await post_alerts(svc, payload_with(starts_at="2026-11-29T17:00:00Z"), expect=200)).body["duplicates"] == 1
            await post_alerts(svc, payload_with(starts_at="2026-11-29T17:10:00Z"), expect=200)
            await svc.drain()
            decisions = await svc.journal.decisions.all.in_thread()
        assert [d.state for d in decisions] == ["succeeded", "blocked", "blocked"]
        assert "cooldown" in decisions[-1].reason
        assert len(sink.received) == 1


async def test_rate_limit_counts_executed_plans(tmp_path: Path):
    """With no cooldown, maxActions per window still bounds the blast radius."""
    async with NotifySink() as sink:
        pol = _policies(tmp_path, sink.url, cooldown="0s", max_actions=2)
        async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
            for minute in range(3):
                await post_alerts(svc, payload_with(starts_at=f"2026-11-29T17:0{minute}:00Z"), expect=200)
                await svc.drain()
            decisions = await svc.journal.decisions.all.in_thread()
    assert [d.state for d in decisions] == ["succeeded", "succeeded", "blocked"]
    assert "rate limit" in decisions[-1].reason
    assert len(sink.received) == 2


async def test_global_freeze_journals_and_does_nothing(tmp_path: Path):
    """freeze: true journals the signal and a blocked decision; nothing is sent."""
    async with NotifySink() as sink:
        pol = _policies(tmp_path, sink.url)
        settings = local_settings(tmp_path, pol, freeze=True)
        async with Service(settings, action_registry(), detector_registry()) as svc:
            await post_alerts(svc, payload_with(), expect=200)
            await svc.drain()
            (decision,) = await svc.journal.decisions.all.in_thread()
    assert decision.state == "blocked" and "freeze" in decision.reason
    assert sink.received == []


async def test_alert_about_another_model_never_acts(tmp_path: Path):
    """The allowlist: an alert whose model label names another model matches no policy."""
    async with NotifySink() as sink:
        pol = _policies(tmp_path, sink.url)
        async with Service(local_settings(tmp_path, pol), action_registry(), detector_registry()) as svc:
            body = (await post_alerts(svc, payload_with(model="fraud-scorer"), expect=200)).body
            await svc.drain()
            assert body["accepted"] == 1
            assert await svc.journal.decisions.all.in_thread() == []
    assert sink.received == []


async def test_pending_signal_is_processed_after_restart(tmp_path: Path):
    """A webhook answered 2xx is journaled; if the daemon stops before acting, the next start acts."""
    async with NotifySink() as sink:
        pol = _policies(tmp_path, sink.url)
        settings = local_settings(tmp_path, pol)
        svc = Service(settings, action_registry(), detector_registry())
        await svc.start()
        # Stop the workers first, as a crash would: the signal is journaled but never processed.
        for task in svc.supervisor.tasks:
            if task.get_name().startswith("worker-"):
                task.cancel()
        await post_alerts(svc, payload_with(), expect=200)
        await svc.stop()
        assert sink.received == []
        async with Service(settings, action_registry(), detector_registry()) as svc2:
            await svc2.drain()
            (sig,) = await svc2.journal.signals.all.in_thread()
        assert sig.state == "processed"
        assert len(sink.received) == 1
