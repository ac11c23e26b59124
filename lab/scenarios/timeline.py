"""Pure pieces of a demo run: the clients' windowed quantiles, markers from the journal, the alert's
pending/firing spans, the decisions table, the progress line, and the timeline order check.

No I/O here: the runner gathers rows and samples, these functions turn them into report parts.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from daemon.report import Marker, Series, Span
from lab.load import RequestSample

QUANTILES = (("P50", 0.5), ("P99", 0.99), ("P99.9", 0.999))
STORY_ORDER = ("deploy", "detection", "action", "verification", "recovery")
"""The order an incident's first markers of each kind must appear in (kinds a scenario lacks are skipped)."""


def nearest_rank(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile `q` of `values` (sorted or not); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def answered_at(sample: RequestSample) -> float:
    """When a request's answer landed (unix seconds): a slow request counts when it ends, as in a histogram."""
    return sample.sent_at_unix + sample.latency_seconds


def window_quantiles(samples: Sequence[RequestSample], now: float, window_seconds: float) -> dict[str, float]:
    """P50/P99/P99.9 in ms of requests answered 200 within (now - window, now]; NaN without any."""
    latencies = [s.latency_seconds * 1000.0 for s in samples
                 if s.status == 200 and now - window_seconds < answered_at(s) <= now]
    return {name: nearest_rank(latencies, q) for name, q in QUANTILES}


def span_quantiles(samples: Sequence[RequestSample], start: float, end: float) -> dict[str, float]:
    """P50/P99/P99.9 in ms of requests sent and answered 200 within [start, end); NaN without any.

    A request still in flight at `end` is left out: what happens there (a model load) holds the
    requests it finds in flight for seconds, and they would read as the span's own latency."""
    latencies = [s.latency_seconds * 1000.0 for s in samples
                 if s.status == 200 and start <= s.sent_at_unix and answered_at(s) < end]
    return {name: nearest_rank(latencies, q) for name, q in QUANTILES}


def client_series(samples: Sequence[RequestSample], start: float, end: float, step_seconds: float,
                  window_seconds: float) -> list[Series]:
    """The clients' P50/P99/P99.9 (ms) every `step_seconds`, each over the trailing window."""
    ordered = sorted(samples, key=answered_at)
    count = max(0, int((end - start) / step_seconds) + 1)
    times = [start + i * step_seconds for i in range(count)]
    columns: dict[str, list[float]] = {name: [] for name, _ in QUANTILES}
    lo = 0
    for t in times:
        # Two pointers over samples sorted by answer time: linear in samples, not quadratic.
        while lo < len(ordered) and answered_at(ordered[lo]) <= t - window_seconds:
            lo += 1
        hi = lo
        latencies: list[float] = []
        while hi < len(ordered) and answered_at(ordered[hi]) <= t:
            if ordered[hi].status == 200:
                latencies.append(ordered[hi].latency_seconds * 1000.0)
            hi += 1
        for name, q in QUANTILES:
            columns[name].append(nearest_rank(latencies, q))
    return [Series(f"{name} clients", times, columns[name], "ms") for name, _ in QUANTILES]


def prometheus_series(name: str, matrix: Sequence[Mapping[str, Any]], scale: float, unit: str,
                      panel: str = "latency") -> Series:
    """One series from a Prometheus range-query matrix (the first result; empty when none), scaled."""
    if not matrix:
        return Series(name, [], [], unit, panel)
    values = matrix[0].get("values", [])
    return Series(name, [float(t) for t, _ in values], [float(v) * scale for _, v in values], unit, panel)


def alert_spans(matrix: Sequence[Mapping[str, Any]], step_seconds: float, alertname: str) -> list[Span]:
    """Pending and firing spans of an alert from a range query of ``ALERTS{alertname=...}``.

    Consecutive samples (no more than 1.5 steps apart) form one span; a span ends at its last sample.
    """
    spans: list[Span] = []
    for result in matrix:
        state = result.get("metric", {}).get("alertstate", "?")
        times = sorted(float(t) for t, _ in result.get("values", []))
        start = prev = None
        for t in times:
            if start is None or prev is None or t - prev > 1.5 * step_seconds:
                if start is not None and prev is not None:
                    spans.append(Span(start, prev + step_seconds, f"{alertname} {state}"))
                start = t
            prev = t
        if start is not None and prev is not None:
            spans.append(Span(start, prev + step_seconds, f"{alertname} {state}"))
    return sorted(spans, key=lambda s: s.start)


def journal_markers(signals: Iterable[Mapping[str, Any]], steps: Iterable[Mapping[str, Any]]) -> list[Marker]:
    """Markers from journal rows: each signal (detection), apply (action), verify (verification) and
    recovery verdict; the `pending` recovery row (the check starting) and intents are not news."""
    markers: list[Marker] = []
    for signal in signals:
        payload = signal.get("payload", {})
        markers.append(Marker(float(signal["received_at"]), f"{payload.get('source', '?')}/{payload.get('name', '?')}",
                              "detection"))
    for step in steps:
        phase, status, at = step["phase"], step["status"], float(step["at"])
        if phase == "apply":
            markers.append(Marker(at, f"{step['action']}: {step['message']}", "action"))
        elif phase == "verify":
            markers.append(Marker(at, f"{status}: {step['message']}", "verification"))
        elif phase == "recovery" and status != "pending":
            markers.append(Marker(at, f"{status}: {step['message']}", "recovery"))
        elif phase in ("escalate", "revert"):
            markers.append(Marker(at, f"{phase} {status}: {step['message']}", phase))
    return sorted(markers, key=lambda m: m.t)


def first_of_each_kind(markers: Iterable[Marker]) -> dict[str, float]:
    """Kind -> time of its first marker."""
    first: dict[str, float] = {}
    for marker in sorted(markers, key=lambda m: m.t):
        first.setdefault(marker.kind, marker.t)
    return first


def story_in_order(markers: Iterable[Marker], kinds: Sequence[str] = STORY_ORDER) -> bool:
    """Whether the first marker of each kind present follows `kinds`' order (deploy, detection, ...)."""
    first = first_of_each_kind(markers)
    times = [first[k] for k in kinds if k in first]
    return all(a <= b for a, b in zip(times, times[1:]))


def decision_rows(decisions: Iterable[Any], steps_by_decision: Mapping[int, Sequence[Mapping[str, Any]]],
                  origin: float) -> list[tuple[str, str, str, str, str]]:
    """The table under the plot: each decision, then its steps (intents left out), times from `origin`."""
    rows: list[tuple[str, str, str, str, str]] = []
    for decision in decisions:
        rows.append((f"+{decision.at - origin:.1f}s", "decision", decision.policy, str(decision.state),
                     decision.reason))
        for step in steps_by_decision.get(decision.id, []):
            if step["phase"] == "intent":
                continue  # written before each apply, for crash recovery; not news
            rows.append((f"+{float(step['at']) - origin:.1f}s", step["phase"], step["action"], step["status"],
                         step["message"]))
    return rows


TABLE_HEADER = ("since start", "row", "policy / action", "state", "detail")


@dataclass(frozen=True)
class Progress:
    """What the live progress line shows."""

    phase: str
    elapsed_seconds: float
    quantiles_ms: Mapping[str, float]
    """The clients' P50/P99/P99.9 over the trailing window (NaN without answers)."""
    signals: int
    actions: int


def progress_text(p: Progress) -> str:
    """One line: phase, elapsed, the clients' current P50/P99/P99.9, signals and actions so far."""
    shown = "  ".join(f"{name} " + ("  --  " if math.isnan(v) else f"{v:5.0f}ms") for name, v in p.quantiles_ms.items())
    return (f"[{p.elapsed_seconds:6.1f}s] {p.phase:<12} {shown}  "
            f"signals {p.signals:<3} actions {p.actions:<3}")


def timeout_ms(raw: str | None) -> float:
    """An Istio duration (``"2s"``, ``"1.5s"``, ``"900ms"``) in ms; NaN when unset or unreadable."""
    if raw is None:
        return math.nan
    try:
        if raw.endswith("ms"):
            return float(raw[:-2])
        if raw.endswith("s"):
            return float(raw[:-1]) * 1000.0
    except ValueError:
        return math.nan
    return math.nan
