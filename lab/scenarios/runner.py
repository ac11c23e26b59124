"""Run one scenario on real local servers and write its report.

Starts Triton, Prometheus (scraping Triton and the clients' view), Alertmanager (posting to
tailguard), the Kubernetes API emulator when the scenario needs it, the daemon and the load; plays
the scenario; reads the journal and Prometheus back; renders the report. Everything started here
is stopped here, in reverse order, also on cancellation (Ctrl-C): servers by their own PID.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from daemon.common.config import Settings
from daemon.report import Marker, Report, Series, Threshold, render_html, render_png
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from lab.alertmanager import AlertmanagerServer
from lab.kube.emulator import KubeEmulator
from lab.kube.seeds import kube_settings, route_timeout, route_weights, write_kubeconfig
from lab.load import run_load
from lab.ports import free_port
from lab.prometheus import PrometheusServer
from lab.scenarios.base import ALERT, FULL, MODEL, SHORT, Run, Scenario, Timings
from lab.scenarios.clients import ClientView
from lab.scenarios.clients_process import ClientsProcess
from lab.scenarios.progress import Console
from lab.scenarios.timeline import (TABLE_HEADER, Progress, alert_spans, client_series, decision_rows,
                                    journal_markers, prometheus_series)
from lab.triton import TritonServer

TOKEN = "demo-token"
PROGRESS_INTERVAL_SECONDS = 0.5


@dataclass
class Outcome:
    """What a run produced: the report files, its markers in time order, and the final objects."""

    scenario: str
    png: Path
    html: Path
    started_at: float
    markers: list[Marker]
    final_objects: dict[str, Any] = field(default_factory=dict)
    verdict: str | None = None

    def write_json(self, path: Path) -> Path:
        """The run's facts for tests and docs: markers (seconds from the start), final objects, files."""
        path.write_text(json.dumps({
            "scenario": self.scenario, "png": str(self.png), "html": str(self.html), "verdict": self.verdict,
            "started_at": self.started_at,
            "markers": [{"t": round(m.t - self.started_at, 2), "kind": m.kind, "label": m.label}
                        for m in self.markers],
            "final_objects": self.final_objects,
        }, indent=2))
        return path

    def timeline(self) -> list[str]:
        """The markers as lines, seconds from the start."""
        return [f"[{m.t - self.started_at:6.1f}s] {m.kind:<12} {m.label}" for m in self.markers]


async def run_scenario(scenario: Scenario, out_dir: Path, short: bool = False,
                       console: Console | None = None, timings: Timings | None = None) -> Outcome:
    """Play `scenario` end to end and write `<out_dir>/<name>.png` and `.html` (`timings`, when
    given, in place of the full or short ones)."""
    timings = timings or (SHORT if short else FULL)
    console = console or Console()
    work = out_dir / f"{scenario.name}-work"
    work.mkdir(parents=True, exist_ok=True)
    started_at = time.time()
    scenario.write_models(work / "models")
    port = free_port()
    triton = TritonServer(work / "models", models=[MODEL], workdir=work / "triton")
    am = AlertmanagerServer(f"http://127.0.0.1:{port}/api/v1/alerts", bearer_token=TOKEN, group_wait="2s",
                            workdir=work / "am")
    clients: ClientView | ClientsProcess = (
        ClientsProcess(MODEL, timings.client_window_seconds, work / "clients") if scenario.clients_process
        else ClientView(MODEL, timings.client_window_seconds))
    rules = work / "rules.yaml"
    rules.write_text(scenario.rules(timings))
    prom = PrometheusServer({"triton": [triton.metrics_target], "clients": []}, scrape_interval="1s",
                            evaluation_interval="1s", rule_files=[rules], alertmanager_targets=[am.target],
                            workdir=work / "prom")
    async with contextlib.AsyncExitStack() as stack:
        await clients.start()
        stack.push_async_callback(clients.stop)
        prom.scrape_targets["clients"] = [clients.target]

        def start_prometheus() -> None:
            # Backfill right before the start, so the history ends where live scrapes begin.
            scenario.backfill(prom.data_dir, time.time(), timings,
                              {"job": "triton", "instance": triton.metrics_target})
            prom.start()

        console.event(time.time() - started_at, f"starting Triton, Prometheus and Alertmanager ({scenario.name})")
        for server in (triton, am, prom):
            stack.push_async_callback(asyncio.to_thread, server.stop)
        starting = asyncio.ensure_future(asyncio.gather(
            asyncio.to_thread(triton.start), asyncio.to_thread(am.start), asyncio.to_thread(start_prometheus),
            return_exceptions=True))
        emulator: KubeEmulator | None = None
        kube: dict[str, Any] | None = None
        try:
            if scenario.uses_kube:  # while the servers start in their threads
                emulator = await stack.enter_async_context(KubeEmulator())
                scenario.seed(emulator)
                kube = kube_settings(write_kubeconfig(work / "kubeconfig", emulator))
            failed = [r for r in await asyncio.shield(starting) if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
        except BaseException:
            # Cancelled (Ctrl-C) or failed: let the starts finish, so that stop() finds every process
            # they launched; a thread cannot be interrupted half-way through Popen.
            await asyncio.wait({starting})
            raise
        await scenario.prepare(triton)
        policies = work / "policies"
        policies.mkdir(exist_ok=True)
        for name, text in scenario.policy_files(triton, timings).items():
            (policies / f"{name}.yaml").write_text(text)
        os.environ["TAILGUARD_WEBHOOK_TOKEN"] = TOKEN
        raw: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": port},
            "policies": {"path": str(policies)},
            "journal": {"path": str(work / "journal.db")},
            "prometheus": {"url": prom.url},
            # The scenarios play one incident on one target at a time, timed without the common-cause
            # hold (on by default: a lone target waits 15 s, 60 s beside another); docs/operations.md states it.
            "blastRadius": {"maxTargetsPerWindow": None, "commonCauseTargets": None},
        }
        if kube is not None:
            raw["kubernetes"] = kube
        service = await stack.enter_async_context(
            Service(Settings.model_validate(raw), action_registry(), detector_registry()))
        run = Run(work=work, timings=timings, triton=triton, prometheus=prom, alertmanager=am, service=service,
                  clients=clients, console=console, emulator=emulator, started_at=started_at)
        await scenario.setup(run)
        run.say(f"tailguard on :{port}, Prometheus {prom.url}, Alertmanager {am.url}, Triton {triton.base_url}")
        async with background(run, scenario):
            await scenario.play(run)
            await asyncio.sleep(timings.settle_seconds)
        await service.drain()
        ended_at = time.time()
        outcome = await _report(run, scenario, out_dir, ended_at)
    outcome.write_json(out_dir / f"{scenario.name}.json")
    return outcome


@contextlib.asynccontextmanager
async def background(run: Run, scenario: Scenario) -> AsyncIterator[None]:
    """Load, the VirtualService sampler and the progress line, cancelled and awaited on exit."""
    run.live_since = time.time()
    tasks = []
    if isinstance(run.clients, ClientsProcess):
        await asyncio.to_thread(run.clients.launch, run.triton.base_url, scenario.rate_per_second,
                                **scenario.clients_options(run))
    else:
        clients = run.clients
        tasks.append(asyncio.create_task(run_load(
            run.triton.base_url, MODEL, rate_per_second=scenario.rate_per_second, duration_seconds=3600.0,
            max_in_flight=64, request_timeout_seconds=10.0, route=scenario.router(run), on_sample=clients.record),
            name="demo-load"))
    tasks.append(asyncio.create_task(_watch(run), name="demo-progress"))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if isinstance(run.clients, ClientsProcess):
            await run.clients.stop()
        run.console.text("")


async def _watch(run: Run) -> None:
    """Every half second: sample the VirtualService (if any) and redraw the progress line."""
    while True:
        if run.emulator is not None:
            vs = run.emulator.get("virtualservices", "serving", MODEL) or {}
            run.vs_history.append((time.time(), route_weights(vs), route_timeout(vs)))
        journal = run.service.journal
        signals = len(await journal.signals.all.in_thread())
        actions = 0
        for decision in await journal.decisions.all.in_thread():
            actions += sum(1 for s in await journal.decisions.steps.in_thread(decision.id) if s.phase == "apply")
        run.console.progress(Progress(run.phase, run.elapsed(), run.clients.quantiles(), signals, actions))
        await asyncio.sleep(PROGRESS_INTERVAL_SECONDS)


def _range(prom: PrometheusServer, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    url = f"{prom.url}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": query, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(url, timeout=30) as resp:
        result: list[dict[str, Any]] = json.load(resp)["data"]["result"]
        return result


async def _report(run: Run, scenario: Scenario, out_dir: Path, ended_at: float) -> Outcome:
    journal = run.service.journal
    decisions = await journal.decisions.all.in_thread()
    steps = {d.id: [asdict(s) for s in await journal.decisions.steps.in_thread(d.id)] for d in decisions}
    signals = [asdict(s) for s in await journal.signals.all.in_thread()]
    markers = sorted(run.markers + journal_markers(signals, [s for rows in steps.values() for s in rows]),
                     key=lambda m: m.t)
    start, end = scenario.report_window(run, ended_at)
    step = max(1.0, (end - start) / 600)  # at most ~600 points a line
    series: list[Series] = []
    for name, query, scale, unit, *panel in scenario.prometheus_series():
        matrix = await asyncio.to_thread(_range, run.prometheus, str(query), start, end, step)
        series.append(prometheus_series(str(name), matrix, float(scale), str(unit), *(str(p) for p in panel)))
    series += client_series(run.clients.samples, run.live_since, end, 1.0, run.timings.client_window_seconds)
    series += scenario.extra_series(run)
    alerts = await asyncio.to_thread(_range, run.prometheus, f'ALERTS{{alertname="{ALERT}"}}', start, end, 1.0)
    verdict = next((s["status"] for rows in steps.values() for s in rows
                    if s["phase"] == "recovery" and s["status"] != "pending"), None)
    report = Report(
        title=f"tailguard demo: {scenario.title}",
        series=series,
        markers=[m for m in markers if start <= m.t <= end or not math.isfinite(m.t)],
        spans=alert_spans(alerts, 1.0, ALERT),
        thresholds=[Threshold(float(v), str(label), *(str(p) for p in panel))
                    for v, label, *panel in scenario.thresholds()],
        table_header=TABLE_HEADER,
        table_rows=decision_rows(decisions, steps, run.started_at),
        notes=[f"scenario {scenario.name}; started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(run.started_at))}"
               " UTC; solid lines: Triton's summaries as Prometheus scraped them; dashed: what the load"
               f" generator's clients saw over a {run.timings.client_window_seconds:.0f}s window"],
    )
    png = await asyncio.to_thread(render_png, report, out_dir / f"{scenario.name}.png")
    html = await asyncio.to_thread(render_html, report, out_dir / f"{scenario.name}.html")
    return Outcome(scenario.name, png, html, run.started_at, markers, dict(scenario.final_objects(run)), verdict)
