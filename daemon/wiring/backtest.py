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
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from core.durations import format_ms_duration, parse_duration
from core.query import Series
from core.signal import Signal
from daemon.common.config import Settings
from daemon.common.metrics import Metrics
from daemon.report import Marker, Report, Threshold, render_html, render_png
from daemon.report import Series as ReportSeries
from daemon.sources.prometheus import PrometheusClient, RangeResult
from daemon.storage.journal import Journal
from daemon.workers.poller import Poller, QueryGroup
from daemon.workers.replay import ReplayDecision, ReplayGuards, chunks, merge_series, window
from daemon.workers.replay_alerts import (COUNT_WINDOW, alert_signal_at, alerts_query, densest_window, firing_onsets,
                                          scrape_interval)
from daemon.workers.shadow import trigger_index
from detectors.base import Detector
from policies.gate import GateVerdict, gate_verdict
from policies.governance import Ruling, Standing, alert_governance, matched_alert, rule
from policies.loader import LoadedPolicy, PolicySet
from policies.matching import alert_trigger_matches, matching_policies

MAX_EVALUATIONS = 200_000
"""Poll cycles one backtest may replay (all triggers together); a longer range needs a larger --step."""
REPORT_SERIES_PER_PANEL = 8


class BacktestError(Exception):
    """The backtest cannot run as asked (bad range, no Prometheus, too many evaluations)."""


class ReplayPrometheus(PrometheusClient):
    """A Prometheus client whose range queries are answered from history read once per (query,
    step) with range queries in chunks, then cut into the windows the poller asks for."""

    ingesting = 0.0  # stored history is whole: no scrape is still being read

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
    # (policy, trigger index) -> (query, interval, series of the target over the range, the line its params fix)
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

    rulings: dict[str, dict[str, Ruling]] = {}  # alert signal's dedup key -> policy -> governed rule at onset
    try:
        poller = Poller(prom, journal, Metrics(), detectors, emit, offload, clock=lambda: clock[0])
        poller.sync(policies)
        await _triton_through_prometheus(poller, prom, result, start, end)
        timeline = await _timeline(poller, prom, result, start, end, step)
        alerts = await _alert_onsets(policies, prom, result, start, end)
        cycles = 0
        events: list[tuple[float, QueryGroup | Signal]] = [*timeline, *alerts]
        for at, item in sorted(events, key=lambda e: (e[0], isinstance(e[1], Signal))):
            clock[0] = at
            if isinstance(item, Signal):  # after the poll cycles of the same moment, as live
                rulings[item.dedup_key] = _rulings(policies, poller, item, at, start)
                await emit(item)
            else:
                cycles += 1
                await poller.poll_group(item, at)
        result.evaluations = cycles
    finally:
        prom.close()
        journal.close()
    guards = ReplayGuards(frozen=settings.freeze)
    if settings.freeze:
        result.notes.append("freeze: true in the settings: every plan is blocked")
    for signal, at in fired:
        for policy in matching_policies(policies.policies, signal):
            ruling = rulings.get(signal.dedup_key, {}).get(policy.name)
            # the alert only notifies (policies.governance): said after the guards, as the ladder does
            notify_only = ruling.reason if ruling is not None and not ruling.acts else None
            decision = guards.decide(policy, signal, at, notify_only)
            if ruling is not None and ruling.backstop and decision.outcome in ("act", "approval"):
                decision = replace(decision, reason=ruling.reason)  # why the alert may act: the backstop
            result.fired.append(Fired(signal, at, decision))
    for policy in policies.enabled:
        for index, trigger in enumerate(policy.spec.triggers):
            if trigger.schedule is not None:
                result.notes.append(f"{policy.name} trigger #{index} (schedule every {trigger.schedule.every:g}s): "
                                    "not replayed: a tick acts on the target's live state, which history lacks")
    result.notes.append("not replayed anywhere: runtime freezes, approvals, Alertmanager silences and grouping "
                        "delays (group_wait), blast-radius limits (history of the journal and Alertmanager); plans "
                        "name the actions, the steps are planned from the target's state when the daemon runs them")
    return result


async def _triton_through_prometheus(poller: Poller, prom: ReplayPrometheus, result: BacktestResult,
                                     start: float, end: float) -> None:
    """A `source: triton` trigger has no history of its own: it is replayed through the same
    metric as Prometheus stored it, on Prometheus' scrape interval (coarser than the live reads)."""
    for key, group in list(poller.groups.items()):
        if group.source != "triton":
            continue
        names = ", ".join(f"{w.policy.name} trigger #{w.bound.index}" for w in group.watches)
        every, why = await _scrape_interval(prom, group.query, start, end)
        if every is None:
            result.notes.append(f"{names} (source: triton, {group.query}): not replayed: {why}")
            del poller.groups[key]
            continue
        result.notes.append(f"{names} (source: triton, {group.query}): replayed through Prometheus' copy of the "
                            f"metric, one step per scrape interval ({every:g} s) where live it reads Triton "
                            f"every {group.interval:g} s: detection can come up to one scrape later")
        group.source, group.endpoints, group.interval = "prometheus", (), every


async def _scrape_interval(prom: ReplayPrometheus, query: str, start: float,
                           end: float) -> tuple[float | None, str]:
    """How often Prometheus stored `query` in [start, end]: samples are counted in windows that end
    inside the range (one at `start` would look only before it, where a short replay from the first
    scrapes finds nothing), then their times read in the densest window at a quarter of the rough
    interval (a count over a part-filled window overstates it). The reason when none is found."""
    width = max(1.0, round(min(COUNT_WINDOW, end - start), 3))
    counts = await PrometheusClient.query_range(prom, f"count_over_time({query}[{format_ms_duration(width * 1000)}])",
                                                min(start + width, end), end, width)
    if counts.error is not None:
        return None, counts.error
    densest = densest_window(counts.series)
    if densest is None:
        return None, "Prometheus stored no sample of it over the range (does it scrape Triton?)"
    at, most = densest
    step = max(0.05, width / most / 4)
    stamps = await PrometheusClient.query_range(prom, f"timestamp({query})", at - width, at, step)
    every = scrape_interval(stamps.series) if stamps.error is None else None
    if every is None:
        return None, stamps.error or "Prometheus stored a single sample of it over the range: no scrape interval"
    return every, ""


async def _alert_onsets(policies: PolicySet, prom: ReplayPrometheus, result: BacktestResult, start: float,
                        end: float) -> list[tuple[float, Signal]]:
    """Each alert trigger's firing onsets in [start, end] from Prometheus' `ALERTS` series, as the
    webhook's signals; a trigger without such a series says why it replays nothing."""
    step = max(1.0, (end - start) / 20_000)
    out: dict[str, tuple[float, Signal]] = {}
    for policy in policies.enabled:
        for index, trigger in enumerate(policy.spec.triggers):
            alert = trigger.alert
            if alert is None:
                continue
            query = alerts_query(alert, {"model": policy.target.model, "namespace": policy.target.namespace})
            found = await PrometheusClient.query_range(prom, query, start, end, step)
            label = f"{policy.name} trigger #{index} (alert {alert.name})"
            if found.error is not None:
                result.notes.append(f"{label}: not replayed: {found.error}")
                continue
            onsets = [(at, alert_signal_at(at, labels)) for at, labels in firing_onsets(found.series, step)]
            mine = [(at, s) for at, s in onsets if alert_trigger_matches(alert, policy, s)]
            if not found.series:
                result.notes.append(f"{label}: not replayed: no {query} in this Prometheus over the range (the rule "
                                    "is evaluated elsewhere, another Prometheus or a ruler, or it never fired)")
                continue
            result.notes.append(f"{label}: replayed from {query}, {len(mine)} onset(s) of firing, each at the "
                                f"first sample Prometheus wrote (to {step:g} s); live, Alertmanager's group_wait "
                                "comes on top")
            out.update((s.dedup_key, (at, s)) for at, s in mine)
    return sorted(out.values(), key=lambda e: e[0])


def _rulings(policies: PolicySet, poller: Poller, signal: Signal, at: float, start: float) -> dict[str, Ruling]:
    """Per policy the alert signal concerns, the governed alert rule (`policies.governance.rule`, as
    `EvidenceReader.governance` rules live) on the governing detectors' replayed cycles at `at`; the
    replay's start is the daemon's (its first `backstopAfter` are not missing evidence)."""
    out = {}
    for policy in matching_policies(policies.policies, signal):
        ref = matched_alert(policy, signal)
        if ref is None or ref.index is None:
            continue
        governance = alert_governance(policy, ref.index)
        fresh = [latest.fresh_at for d in governance.detectors
                 if (latest := poller.latest(policy.name, d)) is not None and latest.fresh_at is not None]
        gate = _gate(policy, poller, ref.index, at) if governance.standing is Standing.UNGOVERNED else None
        out[policy.name] = rule(governance, max(fresh, default=None), start, at, gate)
    return out


def _gate(policy: LoadedPolicy, poller: Poller, alert_index: int, at: float) -> GateVerdict | None:
    """The former evidence gate of an ungoverned alert trigger that declares one, on the replayed
    verdicts at `at` (as `EvidenceReader._gate`)."""
    alert = policy.spec.triggers[alert_index].alert
    if alert is None or alert.gate is None:
        return None
    bound = policy.gate_for(alert_index)
    latest = poller.latest(policy.name, bound.index) if bound is not None else None
    label = bound.params.version_label if bound is not None else "version"
    # A triton trigger replayed on the scrape interval: its evidence is as old as a replayed step,
    # so three of those steps are the floor of its staleness horizon.
    steps = [g.interval for g in poller.groups.values() for w in g.watches
             if bound is not None and w.policy.name == policy.name and w.bound.index == bound.index]
    stale_after = max([latest.stale_after, *(3.0 * s for s in steps)]) if latest else 0.0
    return gate_verdict(latest.budgets if latest else None, latest.at if latest else None,
                        stale_after, at, alert.gate.error, label)


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
            rule = watch.bound.params.recovery_rule
            result.panels[(watch.policy.name, watch.bound.index)] = (
                group.query, group.interval, mine, rule.fixed_level if rule is not None else None)
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
    """The line the signal's detection drew, as ` (threshold 316.2)`; nothing when it drew none."""
    line = s.recovery_line
    return f" ({line.drawn_from} {line.level:g})" if line is not None else ""


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
        lines |= {line.level for f in result.fired
                  if f.decision.policy == policy and trigger_index(f.signal) == index
                  and (line := f.signal.recovery_line) is not None}
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
