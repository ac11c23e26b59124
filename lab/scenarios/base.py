"""What a scenario is (models, policy, rules, the play itself) and what it gets while it plays (`Run`).

A scenario module defines one `Scenario` subclass; `lab/scenarios/runner.py` starts the servers,
the daemon and the load around it and turns the run into a report.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from daemon.report import Marker, Series
from daemon.wiring.service import Service
from lab.alertmanager import AlertmanagerServer
from lab.kube.emulator import KubeEmulator
from lab.prometheus import PrometheusServer
from lab.scenarios.clients import METRIC as CLIENT_METRIC
from lab.scenarios.clients import ClientView
from lab.scenarios.clients_process import ClientsProcess
from lab.scenarios.progress import Console
from lab.triton import TritonServer
from lab.triton import load_version as triton_load_version
from lab.triton import served_versions as triton_served_versions

MODEL = "ranker"
ALERT = "TritonTailLatencyHigh"
CLIENT_P999 = f'max by (model) ({CLIENT_METRIC}{{model="$model", quantile="0.999"}})'
"""The clients' P99.9 (ms) as Prometheus scrapes it: what `verify` asks, like a mesh histogram would."""


@dataclass(frozen=True)
class Timings:
    """How long each phase may take; `short` runs (tests) use smaller ones."""

    baseline_seconds: float
    """Healthy traffic before the incident: the tail detector's baseline."""
    watch_seconds: float
    """Bound on waiting for tailguard's recovery verdict after the incident starts."""
    settle_seconds: float
    """Plot kept running after the verdict, so the report shows the calm after."""
    client_window_seconds: float
    """Window of the clients' quantiles (the gauge Prometheus scrapes and the report's dashed lines)."""
    verify_for: str
    """How long the clients' P99.9 must hold below the line for tailguard to call it recovered."""
    rule_for: str
    """The Alertmanager rule's `for:` (how long P99.9 must stay above 500 ms before it fires)."""
    short: bool = False
    """`--short`: a scenario with phases of its own (canary) picks their short lengths."""


FULL = Timings(baseline_seconds=30, watch_seconds=180, settle_seconds=20, client_window_seconds=15,
               verify_for="10s", rule_for="30s")
SHORT = Timings(baseline_seconds=14, watch_seconds=90, settle_seconds=3, client_window_seconds=8,
                verify_for="4s", rule_for="15s", short=True)


@dataclass
class Run:
    """The running stack a scenario plays on, and the events it has marked so far."""

    work: Path
    timings: Timings
    triton: TritonServer
    prometheus: PrometheusServer
    alertmanager: AlertmanagerServer
    service: Service
    clients: ClientView | ClientsProcess
    console: Console
    emulator: KubeEmulator | None = None
    started_at: float = field(default_factory=time.time)
    markers: list[Marker] = field(default_factory=list)
    phase: str = "starting"
    vs_history: list[tuple[float, dict[str, int], str | None]] = field(default_factory=list)
    """(time, weights, timeout) of the VirtualService, sampled while running (canary)."""
    live_since: float = field(default_factory=time.time)
    """When load started: the report's live part begins here."""

    def elapsed(self) -> float:
        return time.time() - self.started_at

    def mark(self, kind: str, label: str) -> None:
        """A scenario's own marker (deploy, phase change) and a timeline line."""
        self.markers.append(Marker(time.time(), label, kind))
        self.say(f"{kind.upper()}: {label}")

    def say(self, text: str) -> None:
        self.console.event(self.elapsed(), text)

    def enter(self, phase: str) -> None:
        self.phase = phase

    async def verdict(self) -> dict[str, Any] | None:
        """The first recovery verdict in the journal (recovered / not_recovered / unknown), if any."""
        for decision in await self.service.journal.decisions.all.in_thread():
            for step in await self.service.journal.decisions.steps.in_thread(decision.id):
                if step.phase == "recovery" and step.status != "pending":
                    return asdict(step)
        return None

    async def wait_for_verdict(self, timeout_seconds: float) -> dict[str, Any] | None:
        """Poll the journal (bounded) until a recovery verdict or the timeout."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            found = await self.verdict()
            if found is not None:
                return found
            await asyncio.sleep(0.5)
        return None

    async def wait_for_decision(self, timeout_seconds: float) -> bool:
        return await self.first_decision_time(timeout_seconds) is not None

    async def first_decision_time(self, timeout_seconds: float) -> float | None:
        """When the daemon made its first decision (the journal's time), polled (bounded); None if none."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            decisions = await self.service.journal.decisions.all.in_thread()
            if decisions:
                return min(d.at for d in decisions)
            await asyncio.sleep(0.5)
        return None

    async def first_apply_time(self, timeout_seconds: float) -> float | None:
        """When the first action was applied (its journal step's time), polled (bounded); None if none."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            for decision in await self.service.journal.decisions.all.in_thread():
                applied = [float(s.at) for s in await self.service.journal.decisions.steps.in_thread(decision.id)
                           if s.phase == "apply"]
                if applied:
                    return min(applied)
            await asyncio.sleep(0.5)
        return None

    def instant(self, query: str) -> list[dict[str, Any]]:
        """An instant query to the lab Prometheus (blocking; call through a thread on the loop)."""
        url = f"{self.prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        with urllib.request.urlopen(url, timeout=5) as resp:
            result: list[dict[str, Any]] = json.load(resp)["data"]["result"]
            return result


class Scenario:
    """One incident. Subclasses set the names and override what differs; defaults fit `tail`."""

    name = "scenario"
    title = "scenario"
    rate_per_second = 25.0
    uses_kube = False
    model_seed = 0
    """Seed of the model's slow-path choices (`--seed`; the scenarios that seed them read it)."""

    def write_models(self, root: Path) -> None:
        """Write the model repository (model `ranker`) under `root`."""
        raise NotImplementedError

    def policy(self, triton_url: str, timings: Timings) -> str:
        """The policy YAML tailguard runs with."""
        raise NotImplementedError

    def policy_files(self, triton: TritonServer, timings: Timings) -> dict[str, str]:
        """File name (without `.yaml`) -> policy YAML: the policies tailguard runs with; by default
        `policy()` alone."""
        return {MODEL: self.policy(triton.base_url, timings)}

    clients_process = False
    """The clients (load, their /metrics, the router) run as a process of their own
    (lab/scenarios/clients_process.py) rather than on the daemon's event loop."""

    def clients_options(self, run: Run) -> dict[str, Any]:
        """`ClientsProcess.launch` keywords besides Triton and the rate (the router's source)."""
        return {}

    def rules(self, timings: Timings) -> str:
        """Prometheus rule file: the Alertmanager backstop rule the report shows as a span."""
        return f"""
groups:
  - name: triton
    rules:
      - alert: {ALERT}
        expr: max by (model) (nv_inference_request_summary_us{{quantile="0.999"}}) > 500000
        for: {timings.rule_for}
        labels: {{severity: page}}
        annotations: {{summary: "P99.9 of {{{{ $labels.model }}}} above 500 ms"}}
"""

    def backfill(self, data_dir: Path, until: float, timings: Timings, scrape_labels: Mapping[str, str]) -> None:
        """Write history into Prometheus' data dir before it starts (ramp); nothing by default.
        `scrape_labels`: the job and instance Prometheus gives Triton's series."""

    def seed(self, emulator: KubeEmulator) -> None:
        """Objects the emulator holds before the daemon starts (canary)."""

    def router(self, run: Run) -> Callable[[], str | None] | None:
        """Per-request version choice for the load; None lets Triton pick (it serves one version)."""
        return None

    async def prepare(self, triton: TritonServer) -> None:
        """After the servers are up, before the daemon starts (what it must not see: a warm-up)."""

    async def setup(self, run: Run) -> None:
        """After the servers are up, before the daemon and the load start."""

    async def play(self, run: Run) -> None:
        """The incident: baseline, the change, then wait for tailguard's verdict."""
        raise NotImplementedError

    def report_window(self, run: Run, ended_at: float) -> tuple[float, float]:
        """The report's time range: from the live start by default."""
        return run.live_since, ended_at

    def prometheus_series(self) -> list[tuple[str, ...] | tuple[str, str, float, str]]:
        """(name, PromQL, scale, unit[, panel]) of the Prometheus lines (panel: latency by default)."""
        return [(f"{name} Prometheus",
                 f'max by (model) (nv_inference_request_summary_us{{model="{MODEL}",quantile="{q}"}})', 0.001, "ms")
                for name, q in (("P50", "0.5"), ("P99", "0.99"), ("P99.9", "0.999"))]

    def extra_series(self, run: Run) -> list[Series]:
        """More panels (weights, timeout); none by default."""
        return []

    def final_objects(self, run: Run) -> Mapping[str, Any]:
        """What the run left behind worth checking (canary: the VirtualService)."""
        return {}

    def thresholds(self) -> list[tuple[float, str] | tuple[float, str, str]]:
        """(value, label[, panel]) lines; on the latency panel (ms) by default."""
        return [(500.0, "500 ms: the P99.9 line")]


async def load_version(triton: TritonServer, version: int | list[int] | None) -> None:
    """Serve one version of `ranker`, several, or (None) what the repository says, as a deploy does."""
    await triton_load_version(triton, MODEL, version)


def served_versions(triton: TritonServer) -> list[str]:
    """Versions of `ranker` Triton reports READY (blocking)."""
    return triton_served_versions(triton, MODEL)
