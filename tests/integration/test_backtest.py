"""Backtest: an incident backfilled into a real Prometheus (promtool) is replayed through the
policies; the would-be action lands within one poll interval of when the live daemon, stepped
through the same data on its own clock, acts. The backtest calls nothing (a recording stand-in for
Triton and a notify sink see no request), opens no journal file, and writes the report (HTML+PNG).
Pure parts (chunks, windows, guards over the replay) are checked on their own first."""
from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from aiohttp import web

from core.detection import RecoveryLine, Side
from core.query import Series
from core.signal import Signal, SignalSource
from daemon.wiring.backtest import BacktestResult, Fired, backtest, build_report, parse_time, text_lines
from daemon.wiring.cli import main
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from daemon.workers.replay import ReplayDecision, ReplayGuards, chunks, merge_series, window
from lab.prometheus import BackfillSeries, backfill_openmetrics
from policies.loader import load_policies
from tests.support.helpers import NotifySink, local_settings, wait_for

INTERVAL = 15.0
TRIGGER = """
name: ranker-tail
target: {{model: ranker, triton: {{endpoints: ["{triton}"]}}}}
triggers:
  - detector:
      type: threshold
      query: max by (model) (p999_us{{model="$model"}})
      interval: 15s
      params: {{threshold: 500000}}
actions:
{actions}
guards: {{cooldown: 10m}}
"""


class Recorder:
    """A loopback HTTP server standing in for Triton: records every request, answers 500."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _any(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path}")
        return web.Response(status=500)

    async def __aenter__(self) -> "Recorder":
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


@pytest.fixture
async def triton_stand_in() -> AsyncIterator[Recorder]:
    async with Recorder() as recorder:
        yield recorder


def _policies(tmp_path: Path, name: str, triton: str, actions: str) -> Path:
    pol = tmp_path / name
    pol.mkdir()
    (pol / "p.yaml").write_text(TRIGGER.format(triton=triton, actions=actions))
    return pol


# ---- pure parts ----------------------------------------------------------------------------------


def test_chunks_cover_the_range_on_one_grid():
    """Consecutive chunks of at most N points, each on the grid start + k*step, nothing missed."""
    parts = chunks(0.0, 100.0, 10.0, max_points=4)
    assert parts == [(0.0, 30.0), (40.0, 70.0), (80.0, 100.0)]
    assert chunks(0.0, 5.0, 10.0) == [(0.0, 5.0)]


def test_merge_and_window():
    """Chunks join per series; a window keeps the points inside it and drops series without any."""
    a1 = Series({"model": "a"}, (0.0, 10.0), (1.0, 2.0))
    a2 = Series({"model": "a"}, (20.0,), (3.0,))
    b = Series({"model": "b"}, (0.0,), (9.0,))
    merged = {s.labels["model"]: s for s in merge_series([[a1, b], [a2]])}
    assert merged["a"].timestamps == (0.0, 10.0, 20.0) and merged["a"].values == (1.0, 2.0, 3.0)
    (only,) = window(list(merged.values()), 10.0, 20.0)
    assert only.labels == {"model": "a"} and only.values == (2.0, 3.0)


def test_replay_guards_count_only_the_replays_own_actions(tmp_path: Path):
    """The first signal acts, the next within the cooldown is blocked, one after it acts again."""
    (policy,) = load_policies(_policies(tmp_path, "p", "http://127.0.0.1:9", "  - type: triton.rollback"),
                              action_registry(), detector_registry()).policies
    guards = ReplayGuards()

    def signal(n: int) -> Signal:
        return Signal(SignalSource.DETECTOR, "threshold", {"model": "ranker"}, _utc(0), f"detector:ranker-tail:0:{n}",
                      policy="ranker-tail", details={"threshold": 500000.0, "query": policy.detectors[0].trigger.query},
                      recovery_line=RecoveryLine(500000.0, Side.BELOW, "threshold"))

    first = guards.decide(policy, signal(1), 1000.0)
    assert first.acts and first.actions == "triton.rollback()" and "below 500000" in (first.recovery or "")
    assert guards.decide(policy, signal(2), 1300.0).reason.startswith("cooldown")
    assert guards.decide(policy, signal(3), 1700.0).acts


def test_text_and_report_show_the_line_each_signal_drew():
    """A signal's line is printed beside its value and drawn on its trigger's panel with the line the
    params fix; a signal that drew none (tail_excess on counters) prints none."""
    def fired(index: int, value: float, line: RecoveryLine | None) -> Fired:
        signal = Signal(SignalSource.DETECTOR, "tail_anomaly", {"model": "ranker"}, _utc(0),
                        f"detector:ranker-tail:{index}:x", value=value, policy="ranker-tail",
                        details={"reason": "why"}, recovery_line=line)
        return Fired(signal, 10.0, ReplayDecision(10.0, "ranker-tail", "default/ranker", "blocked", "cooldown", ""))

    result = BacktestResult(0.0, 60.0, fired=[fired(0, 900.0, RecoveryLine(316.2, Side.BELOW, "threshold")),
                                              fired(1, 14.5, None)])
    result.panels[("ranker-tail", 0)] = ("p999", 5.0, [], 500.0)
    lines = text_lines(result)
    assert lines[1].endswith("tail_anomaly on model=ranker: value 900 (threshold 316.2): why")
    assert lines[3].endswith("tail_anomaly on model=ranker: value 14.5: why")
    report = build_report(result)
    assert [t.value for t in report.thresholds] == [316.2, 500.0]


def test_parse_time():
    assert parse_time("now-2h", 10_000.0) == 2800.0
    assert parse_time("1700000000", 0.0) == 1_700_000_000.0
    assert parse_time("2026-11-29T17:00:00Z", 0.0) == parse_time("2026-11-29T17:00:00", 0.0)


def _utc(t: float) -> Any:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc)


# ---- against real history --------------------------------------------------------------------------


def _incident(end: float, incident_at: float) -> list[tuple[float, float]]:
    """An hour of ~200 ms P99.9 (in microseconds), then 900 ms from `incident_at`, every 15 s."""
    rng = random.Random(11)
    out = []
    t = end - 3600.0
    while t <= end:
        out.append((t, (900_000.0 if t >= incident_at else 200_000.0) + rng.gauss(0, 5_000)))
        t += INTERVAL
    return out


@pytest.mark.integration
async def test_backtest_acts_within_one_interval_of_the_live_daemon(
        tmp_path: Path, prometheus_factory, triton_stand_in: Recorder, capsys: pytest.CaptureFixture[str]):
    """Backtest first (it must call nothing and write no journal), then the live daemon stepped
    through the same data with a clock off the backtest's grid: both act, within one interval."""
    data_end = time.time() - 3600.0  # promtool writes past blocks; the live clock is set back to them
    incident_at = data_end - 600.0
    data = tmp_path / "tsdb"
    backfill_openmetrics(data, [BackfillSeries("p999_us", _incident(data_end, incident_at), {"model": "ranker"})])
    prom = await prometheus_factory(scrape_targets={}, data_dir=data)

    async with NotifySink() as sink:
        notify = f"  - type: notify\n    url: {sink.url}"
        bt_policies = _policies(tmp_path, "bt", triton_stand_in.url,
                                f"  - type: triton.rollback\n    to: previous\n{notify}")
        bt_dir = tmp_path / "bt-home"
        bt_dir.mkdir()
        bt_settings = local_settings(bt_dir, bt_policies, prometheus={"url": prom.url})
        policies = load_policies(bt_policies, action_registry(), detector_registry())
        result = await backtest(bt_settings, policies, detector_registry(), incident_at - 300.0, incident_at + 300.0)
        lines = text_lines(result)
        (plan,) = result.plans
        assert plan.decision.actions.startswith("triton.rollback(to=previous); notify(url=")
        assert any(" plan " in line and "triton.rollback" in line for line in lines), lines

        config = bt_dir / "config.yaml"
        config.write_text(json.dumps({"policies": {"path": str(bt_policies)}, "prometheus": {"url": prom.url},
                                      "journal": {"path": str(bt_dir / "journal.db")}}))
        report = tmp_path / "report" / "backtest.html"
        report.parent.mkdir()
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["backtest", "--config", str(config), "--from", str(incident_at - 300.0),
                                              "--to", str(incident_at + 300.0), "--json", "--report", str(report)])
        assert code == 0
        records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        acted = [r["at"] for r in records if r["decision"]["outcome"] == "act"]
        assert acted == [plan.at]
        assert report.stat().st_size > 0 and report.with_suffix(".png").stat().st_size > 10_000
        # Nothing called, nothing journaled.
        assert triton_stand_in.requests == [] and sink.received == []
        assert not (bt_dir / "journal.db").exists()

        live_at = await _live_action_time(tmp_path, prom.url, triton_stand_in.url, notify,
                                          start=incident_at - 60.0 + 7.0)
        assert len(sink.received) == 1
    assert abs(plan.at - live_at) <= INTERVAL, (plan.at - incident_at, live_at - incident_at)


async def _live_action_time(tmp_path: Path, prom_url: str, triton: str, notify: str, start: float) -> float:
    """Run the daemon on a clock the test steps one interval at a time (each step waits for that poll
    cycle's verdicts), until it acts; the moment of the poll whose signal it acted on."""
    live_policies = _policies(tmp_path, "live", triton, notify)
    now = [start]
    settings = local_settings(tmp_path, live_policies, prometheus={"url": prom_url})
    async with Service(settings, action_registry(), detector_registry(), clock=lambda: now[0]) as svc:
        await wait_for(lambda: bool(svc.journal.evaluations.all()), timeout=30)
        for _ in range(20):
            if svc.journal.signals.all():
                break
            mark = time.time()
            now[0] += INTERVAL
            await wait_for(lambda: any(e.at > mark for e in svc.journal.evaluations.all()), timeout=30)
        await svc.drain()
        decisions = await svc.journal.decisions.all.in_thread()
        (signal,) = await svc.journal.signals.all.in_thread()
    (decision,) = decisions
    assert decision.state == "succeeded", decision.reason
    return Signal.from_summary(signal.payload).observed_at.timestamp()
