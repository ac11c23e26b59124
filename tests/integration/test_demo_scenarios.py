"""Issue 14 and 27 evidence: `python -m lab.demo --short` plays tail and ramp end to end on real Triton,
Prometheus and Alertmanager, each writing a report; the timeline comes in story order and the PNG
is a real picture. The canary scenarios have their own test (test_canary_lab.py, issue 23).

The two run side by side as subprocesses (each its own servers on free ports), so the whole test
takes about as long as the slowest one; each is stopped by its PID if it overstays its bound.
"""
from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from daemon.wiring.backtest import backtest, text_lines
from daemon.wiring.registries import action_registry, detector_registry
from policies.loader import load_policies
from tests.support.demo_runs import run_demos
from tests.support.helpers import example_backtest_settings
from tests.support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIOS = ("tail", "ramp")
EXAMPLE = REPO / "examples" / "policies" / "ranker.yaml"
BOUND_SECONDS = 480.0
"""Per scenario, far above a short run (tail: ~2-4 min on 2 cores, its detector decides on the
evidence of 0.5% slow requests at 40 req/s): a hang fails, it never blocks CI."""


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def first(markers: list[dict[str, Any]], kind: str) -> float:
    return min(m["t"] for m in markers if m["kind"] == kind)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Start the short demos at once, wait (bounded) for each, and read their JSON summaries."""
    return run_demos(tmp_path_factory.mktemp("demo"), SCENARIOS, BOUND_SECONDS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_report_is_a_real_picture_and_a_page(runs: dict[str, dict[str, Any]], name: str) -> None:
    """Each scenario writes a PNG of sane size and dimensions and an HTML page embedding it."""
    run = runs[name]
    data = Path(run["png"]).read_bytes()
    width, height = png_size(data)
    assert 900 <= width <= 1500 and 600 <= height <= 2000, (width, height)
    assert 30_000 < len(data) < 1_000_000
    page = Path(run["html"]).read_text()
    assert "data:image/png;base64," in page and "<h2>Decisions</h2>" in page
    assert f"report: {run['html']}" in run["log"]  # the CLI prints where the report is


@pytest.mark.parametrize("name", ["tail"])
def test_incident_timeline_in_story_order(runs: dict[str, dict[str, Any]], name: str) -> None:
    """deploy -> detection -> action -> verification -> recovery, and the verdict is 'recovered'."""
    run = runs[name]
    markers = run["markers"]
    times = [first(markers, k) for k in ("deploy", "detection", "action", "verification", "recovery")]
    assert times == sorted(times), markers
    assert run["verdict"] == "recovered", markers


def test_tail_is_the_real_incident_rolled_back_by_the_example_policy(runs: dict[str, dict[str, Any]]) -> None:
    """`make demo`'s incident: P99.9 jumps past 500 ms while the clients' P99 stays under 2x its
    pre-deploy value, and the example policy's triggers roll ranker back, the time printed."""
    run = runs["tail"]
    markers = run["markers"]
    signals = {m["label"] for m in markers if m["kind"] == "detection"}
    assert signals <= {"detector/tail_excess", "alert/TritonTailLatencyHigh"} and signals, markers
    assert any(m["kind"] == "action" and m["label"].startswith("triton.rollback") for m in markers)
    facts = run["final_objects"]
    before, during = facts["clients_ms"]["before"], facts["clients_ms"]["during"]
    # P99.9's jump is what the signal above decided on; a short window to a fast decision may hold
    # no slow request of its own, so the clients' P99.9 is not asserted over it.
    assert before["P99.9"] < 500, facts
    assert during["P99"] < 2 * before["P99"], facts
    assert facts["ttr_seconds"] > 0 and "time to remediate" in run["log"]


async def test_backtest_over_the_demos_recorded_run_replays_both_triggers(
        runs: dict[str, dict[str, Any]], tmp_path: Path, prometheus_factory: Any) -> None:
    """The demo keeps its Prometheus data in its output folder; backtesting the example policy over
    it replays the detector trigger (through Prometheus' copy of Triton's counters, 1 s scrapes) and
    the alert trigger (from ALERTS, governed: notify-only while the detector sees the target).

    Whether the replay plans the rollback too is not certain: live, the start test read Triton's
    /metrics and crossed in v2's last seconds before the rollback cut its series; Prometheus' copy
    falls a little apart from those reads, and its crossing may need a sample the rollback never let
    Triton export (seen in CI: the replay's crossing 8 s past the live one). The plan a replay does
    make is the rollback, inside the run; tests/integration/test_backtest_example.py asserts the
    plan on history long enough to hold it."""
    run = runs["tail"]
    data = Path(run["png"]).parent / "tail-work" / "prom" / "data"
    prom = await prometheus_factory(scrape_targets={}, data_dir=data)
    settings = example_backtest_settings(tmp_path, EXAMPLE.name, prom.url)
    pol = Path(settings.policies.path)
    deploy = run["started_at"] + first(run["markers"], "deploy")
    acted = run["started_at"] + first(run["markers"], "action")
    result = await backtest(settings, load_policies(pol, action_registry(), detector_registry()),
                            detector_registry(), deploy - 20.0, acted + 5.0)
    lines = text_lines(result)
    print("\n".join(lines))
    assert result.evaluations > 30, lines
    alerts = [f for f in result.fired if f.signal.name == "TritonTailLatencyHigh"]
    first_plan = min((plan.at for plan in result.plans), default=math.inf)
    for alert in alerts:  # governed: the detector judged fresh data of ranker throughout
        why = "cooldown" if alert.at >= first_plan else "notify only"
        assert alert.decision.outcome == "blocked" and why in alert.decision.reason, lines
    for plan in result.plans:
        assert plan.signal.name == "tail_excess", lines
        assert plan.decision.actions.startswith("triton.rollback(to=previous"), lines
        assert deploy <= plan.at <= acted + 5.0, lines
    assert alerts or result.plans, lines  # the alert fired in every demo run, or the detector planned
    notes = "\n".join(result.notes)
    assert "one step per scrape interval" in notes, notes


def test_ramp_runs_the_forecast_example_with_only_its_endpoints_filled_in(runs: dict[str, dict[str, Any]]) -> None:
    """The ramp decides with examples/policies/forecast.yaml itself: the policy it ran differs from
    the example in the Triton endpoints and, in a short run, the verify window's length only."""
    ran = yaml.safe_load((Path(runs["ramp"]["png"]).parent / "ramp-work" / "policies" / "ranker.yaml").read_text())
    example = yaml.safe_load((REPO / "examples" / "policies" / "forecast.yaml").read_text())
    assert ran["target"]["triton"]["endpoints"][0].startswith("http://127.0.0.1:")
    for doc in (ran, example):
        del doc["target"]["triton"]
        doc["verify"] = {k: v for k, v in doc["verify"].items() if k not in ("for", "interval")}
    assert ran == example


def test_ramp_forecaster_acts_before_the_line(runs: dict[str, dict[str, Any]]) -> None:
    """The forecast detector fires and rolls back while the P99.9 v2's clients see is still below
    500 ms (v2 leaks smoothly, noisy per request), then it recovers. (The comparison alert on
    Triton's own P99.9 acts on nothing here; on a loaded machine, CPU contention can push that
    server-side quantile over its line first.)"""
    run = runs["ramp"]
    markers = run["markers"]
    detection = next(m for m in markers if m["kind"] == "detection" and m["label"].startswith("detector/"))
    assert detection["label"] == "detector/forecast_breach"
    times = [first(markers, "phase"), detection["t"]] + [first(markers, k) for k in ("action", "verification", "recovery")]
    assert times == sorted(times), markers
    assert run["verdict"] == "recovered"
    levels = [int(line.split("takes ")[1].split(" ms")[0]) for line in run["log"].splitlines() if "v2 now takes" in line]
    assert all(level < 500 for level in levels), levels
    at = run["final_objects"]["at_decision"]
    assert at["decided"] and at["clients_p999_ms"] < 500, at  # the highest P99.9 the clients saw before it
