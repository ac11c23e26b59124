"""The one intake path (daemon/workers/signal_intake.py) the webhook and the detectors share: new
signals and duplicates counted, the journal's refusals mapped, and faults counted only for what is lost
or for a journal that failed."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
import structlog

from core.signal import Signal, SignalSource
from daemon.common.metrics import Metrics
from daemon.storage.journal import Journal
from daemon.workers.signal_intake import Recorded, Refusal, SignalIntake


def _signal(key: str, source: SignalSource = SignalSource.ALERT, name: str = "TailHigh") -> Signal:
    return Signal(source, name, {"model": "m"}, datetime.now(timezone.utc), key)


def _value(metrics: Metrics, metric: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(metric, labels) or 0.0


@pytest.fixture
def journal(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A journal that takes 4 pending signals."""
    j = Journal(tmp_path / "journal.db", max_pending=4)
    yield j
    j.close()


async def test_new_signals_and_resent_duplicates_are_counted(journal: Journal) -> None:
    """Alertmanager's resends count as deduplicated alerts; every new signal counts by source and name."""
    metrics = Metrics()
    intake = SignalIntake(journal, metrics)
    assert await intake.record([_signal("a"), _signal("b")], resent=True) == Recorded(2, 0)
    assert await intake.record([_signal("a")], resent=True) == Recorded(0, 1)
    assert _value(metrics, "tailguard_alerts_deduplicated_total") == 1
    assert _value(metrics, "tailguard_signals_total", source="alert", name="TailHigh") == 2
    assert await intake.record([_signal("d", SignalSource.DETECTOR, "tail")], resent=False) == Recorded(1, 0)
    assert await intake.record([_signal("d", SignalSource.DETECTOR, "tail")], resent=False) == Recorded(0, 1)
    assert _value(metrics, "tailguard_alerts_deduplicated_total") == 1  # a detector's repeat is no resent alert
    assert _value(metrics, "tailguard_signals_total", source="detector", name="tail") == 1
    assert [s.dedup_key for s in journal.signals.all()] == ["a", "b", "d"]


async def test_a_busy_journal_is_no_fault_for_alertmanager_and_a_lost_signal_for_a_detector(journal: Journal) -> None:
    """Past max_pending: BUSY either way; the webhook's sender retries (no fault), a detector's
    signal is dropped (a journal fault and a warning naming it)."""
    metrics = Metrics()
    intake = SignalIntake(journal, metrics)
    await intake.record([_signal(f"k{i}") for i in range(4)], resent=True)
    with structlog.testing.capture_logs() as logs:
        busy = await intake.record([_signal("late")], resent=True)
        assert _value(metrics, "tailguard_faults_total", component="journal") == 0
        dropped = await intake.record([_signal("tick", SignalSource.SCHEDULE, "schedule")], resent=False)
    assert (busy.refused, dropped.refused) == (Refusal.BUSY, Refusal.BUSY)
    assert "4 signals pending" in busy.error and busy.new == 0
    assert _value(metrics, "tailguard_faults_total", component="journal") == 1
    assert [(e["event"], e.get("signal")) for e in logs] == [
        ("backlog full; asking Alertmanager to retry", None), ("journal backlog full; signal dropped", "tick")]


async def test_an_unstorable_value_is_invalid_and_a_failing_journal_unavailable(journal: Journal) -> None:
    """A value the journal cannot store: INVALID (no fault for the webhook, which answers 422); a
    journal that fails: UNAVAILABLE, a fault for every sender."""
    metrics = Metrics()
    intake = SignalIntake(journal, metrics)
    bad = Signal(SignalSource.ALERT, "Tail\ud800", {"model": "m"}, datetime.now(timezone.utc), "bad")
    invalid = await intake.record([bad], resent=True)
    assert invalid.refused is Refusal.INVALID and "name" in invalid.error
    assert _value(metrics, "tailguard_faults_total", component="journal") == 0
    assert (await intake.record([bad], resent=False)).refused is Refusal.INVALID
    assert _value(metrics, "tailguard_faults_total", component="journal") == 1  # lost
    journal.close()
    with structlog.testing.capture_logs() as logs:
        down = await intake.record([_signal("x")], resent=True)
    assert down.refused is Refusal.UNAVAILABLE and "closed" in down.error
    assert _value(metrics, "tailguard_faults_total", component="journal") == 2
    assert [e["event"] for e in logs] == ["journal write failed; asking Alertmanager to retry"]
