"""`tailguard backtest`: replay a range of real Prometheus history through the loaded policies.

Each detector trigger is evaluated at every step of the range by the poller's own detection path
(`Poller.poll_group`, the same range windows, detectors, series matching and signals as live),
fed from history read once per query with range queries (`ReplayPrometheus`). Each signal is then
decided as the executor would (shadow, guards, approval, dry run: `daemon.workers.replay`), with
only the backtest's own would-be actions as guard history. Nothing is written: no target is
observed or changed (no action code runs), no journal file is opened (the poller's evaluation rows
go to an in-memory database that is dropped).
"""
from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from core.durations import parse_duration
from core.query import Series
from core.signal import Signal
from daemon.common.config import Settings
from daemon.common.metrics import Metrics
from daemon.report import Marker, Report, Threshold, render_html, render_png
from daemon.report import Series as ReportSeries
from daemon.sources.prometheus import PrometheusClient, RangeResult
from daemon.storage.journal import AsyncJournal, Journal
from daemon.workers.poller import Poller, QueryGroup
from daemon.workers.replay import ReplayDecision, ReplayGuards, chunks, merge_series, window
from daemon.workers.shadow import trigger_index
from detectors.base import Detector
from policies.loader import PolicySet
from policies.matching import matching_policies

MAX_EVALUATIONS = 200_000
"""Poll cycles one backtest may replay (all triggers together); a longer range needs a larger --step."""
REPORT_SERIES_PER_PANEL = 8


class BacktestError(Exception):
    """The backtest cannot run as asked (bad range, no Prometheus, too many evaluations)."""


class ReplayPrometheus(PrometheusClient):
    """A Prometheus client whose range queries are answered from history read once per (query,
    step) with range queries in chunks, then cut into the windows the poller asks for."""

    def __init__(self, url: str, timeout_seconds: float, end: float) -> None:
        super().__init__(url, timeout_seconds)
        self._end = end
        self.history: dict[tuple[str, float], RangeResult] = {}
        self.fetches = 0

    async def prefetch(self, query: str, step: float, start: float) -> RangeResult:
        """History of `query` on the grid `start + k * step` up to the replay's end."""
        key = (query, step)
        if key not in self.history:
            parts = []
            for lo, hi in chunks(start, self._end, step):
                self.fetches += 1
                part = await super().query_range(query, lo, hi, step)
                if part.error is not None:
                    self.history[key] = part
                    return part
                parts.append(part.series)
            self.history[key] = RangeResult(query, merge_series(parts))
        return self.history[key]

    async def query_range(self, promql: str, start: float, end: float, step_seconds: float) -> RangeResult:
        full = self.history.get((promql, step_seconds)) or await self.prefetch(promql, step_seconds, start)
        if full.error is not None:
            return RangeResult(promql, error=full.error)
        return RangeResult(promql, window(full.series, start, end))


@dataclass(frozen=True)
class Fired:
    """One signal the replay raised, with the decision it would have got."""

    signal: Signal
    at: float
    decision: ReplayDecision


@dataclass
class BacktestResult:
    start: float
    end: float
    evaluations: int = 0
    fired: list[Fired] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (policy, trigger index) -> (query, interval, series of the target over the range, threshold param)
    panels: dict[tuple[str, int], tuple[str, float, list[Series], float | None]] = field(default_factory=dict)

    @property
    def plans(self) -> list[Fired]:
        return [f for f in self.fired if f.decision.outcome in ("act", "approval")]


async def backtest(settings: Settings, policies: PolicySet, detectors: Mapping[str, type[Detector]],
                   start: float, end: float, step: float | None = None) -> BacktestResult:
    """Replay [start, end] through `policies`' detector triggers; every step (default: each trigger's
    interval) is one poll cycle at that moment.

    Raises:
        BacktestError: no prometheus.url, an empty range, or more than MAX_EVALUATIONS cycles.
    """
    if not settings.prometheus.url:
        raise BacktestError("no prometheus.url in the settings: nothing to replay")
    if end <= start:
        raise BacktestError("--to must be after --from")
    result = BacktestResult(start, end)
    prom = ReplayPrometheus(settings.prometheus.url, settings.prometheus.timeout_seconds, end)
    journal = Journal(":memory:")  # the poller's evaluation rows; dropped when the backtest ends
    fired: list[tuple[Signal, float]] = []
    seen: set[str] = set()
    clock = [start]

    async def emit(signal: Signal) -> None:
        if signal.dedup_key not in seen:  # the journal's dedup: one signal per episode
            seen.add(signal.dedup_key)
            fired.append((signal, clock[0]))

    async def offload(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    try:
        poller = Poller(prom, AsyncJournal(journal), Metrics(), detectors, emit, offload, clock=lambda: clock[0])
        poller.sync(policies)
        timeline = await _timeline(poller, prom, result, start, end, step)
        for at, group in timeline:
            clock[0] = at
            await poller.poll_group(group, at)
        result.evaluations = len(timeline)
    finally:
        prom.close()
        journal.close()
    guards = ReplayGuards(frozen=settings.freeze)
    if settings.freeze:
        result.notes.append("freeze: true in the settings: every plan is blocked")
    for signal, at in fired:
        for policy in matching_policies(policies.policies, signal):
            result.fired.append(Fired(signal, at, guards.decide(policy, signal, at)))
    result.notes.append("not replayed: runtime freezes, approvals, Alertmanager silences, blast-radius limits and "
                        "alert triggers (history of the journal and Alertmanager); plans name the actions, the "
                        "steps are planned from the target's state when the daemon runs them")
    return result


async def _timeline(poller: Poller, prom: ReplayPrometheus, result: BacktestResult, start: float, end: float,
                    step: float | None) -> list[tuple[float, QueryGroup]]:
    """Every (moment, group) poll cycle of the range in time order; history read first, per query."""
    timeline: list[tuple[float, int, QueryGroup]] = []
    groups = []
    for group in poller.groups.values():
        if getattr(group, "source", "prometheus") != "prometheus":
            result.notes.append(f"not replayed: {group.query} reads Triton's /metrics live (no history)")
        else:
            groups.append(group)
    # One read per query and step, from the earliest moment any group sharing it looks back to.
    since: dict[tuple[str, float], float] = {}
    for group in groups:
        for query in filter(None, (group.query, group.companion)):
            key = (query, group.interval)
            since[key] = min(since.get(key, math.inf), start - group.lookback)
    for (query, interval), first in since.items():
        await prom.prefetch(query, interval, first)
    for n, group in enumerate(groups):
        every = step or group.interval
        count = int(math.floor((end - start) / every + 1e-9)) + 1
        if len(timeline) + count > MAX_EVALUATIONS:
            raise BacktestError(f"{len(timeline) + count} poll cycles exceed {MAX_EVALUATIONS}; "
                                "pass a larger --step or a shorter range")
        history = prom.history[(group.query, group.interval)]
        if history.error is not None:
            result.notes.append(f"query failed, not replayed: {group.query}: {history.error}")
            continue
        for watch in group.watches:
            mine = [s for s in window(history.series, start, end)
                    if s.labels.get(watch.bound.trigger.model_label, watch.policy.target.model)
                    == watch.policy.target.model]
            limit = watch.bound.params.model_dump().get("threshold")
            result.panels[(watch.policy.name, watch.bound.index)] = (
                group.query, group.interval, mine, float(limit) if isinstance(limit, (int, float)) else None)
        timeline.extend((start + k * every, n, group) for k in range(count))
    timeline.sort(key=lambda item: (item[0], item[1]))
    return [(at, group) for at, _, group in timeline]


# ---- output -------------------------------------------------------------------------------------


def iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def text_lines(result: BacktestResult) -> list[str]:
    """The human output: one line per signal and per decision, in time order, then a summary."""
    lines = [f"backtest {iso(result.start)} .. {iso(result.end)}: {result.evaluations} poll cycle(s) replayed"]
    for f in result.fired:
        s, d = f.signal, f.decision
        series = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "__name__")
        value = f" value {s.value:g}" if s.value is not None else ""
        line = _threshold_text(s)
        lines.append(f"{iso(f.at)}  signal   {d.policy}  {s.name} on {series}:{value}{line}: "
                     f"{s.details.get('reason', '')}")
        if d.outcome in ("act", "approval"):
            verb = "plan" if d.outcome == "act" else "approval"
            then = f"; then checks {d.recovery}" if d.recovery else ""
            lines.append(f"{iso(f.at)}  {verb:<8} {d.policy}  {d.target}: {d.actions}{then}")
        else:
            lines.append(f"{iso(f.at)}  {d.outcome:<8} {d.policy}  {d.target}: {d.reason}")
    counts = {o: sum(1 for f in result.fired if f.decision.outcome == o)
              for o in ("act", "approval", "blocked", "dry_run", "shadow")}
    lines.append(f"summary: {len(result.fired)} signal(s); {counts['act']} plan(s) would have run, "
                 f"{counts['approval']} would have waited for approval, {counts['blocked']} blocked, "
                 f"{counts['dry_run']} dry run, {counts['shadow']} shadow")
    lines.extend(f"note: {n}" for n in result.notes)
    return lines


def json_records(result: BacktestResult) -> list[dict[str, Any]]:
    return [{"at": f.at, "time": iso(f.at), "signal": f.signal.summary(), "decision": f.decision.as_dict()}
            for f in result.fired]


def _threshold_text(s: Signal) -> str:
    threshold, baseline = s.details.get("threshold"), s.details.get("baseline")
    if isinstance(threshold, (int, float)):
        return f" (threshold {threshold:g})"
    if isinstance(baseline, (int, float)):
        return f" (baseline {baseline:g})"
    return ""


def build_report(result: BacktestResult) -> Report:
    """The series each trigger read, its threshold, and a marker per signal and would-be plan."""
    series: list[ReportSeries] = []
    thresholds: list[Threshold] = []
    for (policy, index), (query, _, found, limit) in sorted(result.panels.items()):
        panel = f"{policy} #{index}"
        for s in found[:REPORT_SERIES_PER_PANEL]:
            name = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "__name__") or query[:40]
            series.append(ReportSeries(name, s.timestamps, s.values, "", panel))
        lines = {limit} if limit is not None else set()
        lines |= {float(f.signal.details["threshold"]) for f in result.fired
                  if f.decision.policy == policy and trigger_index(f.signal) == index
                  and isinstance(f.signal.details.get("threshold"), (int, float))}
        thresholds.extend(Threshold(v, f"{policy} threshold {v:g}", panel) for v in sorted(lines)[:3])
    markers: list[Marker] = []
    rows: list[tuple[str, ...]] = []
    for f in result.fired:
        d = f.decision
        markers.append(Marker(f.at, f"{f.signal.name} ({d.policy})", "detection"))
        if d.outcome in ("act", "approval"):
            markers.append(Marker(f.at, f"would run {d.actions[:40]}", "action"))
        rows.append((iso(f.at), d.policy, f.signal.name, d.outcome, d.actions if d.outcome in ("act", "approval")
                     else d.reason))
    notes = [f"{result.evaluations} poll cycles replayed from Prometheus history; nothing was applied"] + result.notes
    return Report(title=f"tailguard backtest {iso(result.start)} .. {iso(result.end)}", series=series,
                  markers=markers, thresholds=thresholds, table_header=("time", "policy", "signal", "outcome",
                                                                        "would-be plan or why not"),
                  table_rows=rows, notes=notes)


def write_report(result: BacktestResult, path: Path) -> list[Path]:
    """The HTML page at `path` (.html added when missing) and its PNG beside it."""
    html = path if path.suffix == ".html" else path.with_suffix(".html")
    report = build_report(result)
    return [render_html(report, html), render_png(report, html.with_suffix(".png"))]


_RELATIVE = re.compile(r"^now(-(?P<ago>.+))?$")


def parse_time(text: str, now: float) -> float:
    """`now`, `now-2h`, unix seconds, or ISO 8601 (`2026-11-29T17:00:00Z`; no zone means UTC).

    Raises:
        ValueError: none of these.
    """
    text = text.strip()
    relative = _RELATIVE.match(text)
    if relative:
        return now - (parse_duration(relative.group("ago")) if relative.group("ago") else 0.0)
    try:
        return float(text)
    except ValueError:
        pass
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()
