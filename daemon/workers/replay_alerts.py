"""Alert and Triton-source triggers in a backtest, pure: the moments Prometheus' `ALERTS` series
says an alert started firing, as the Signals the webhook would have carried, and the scrape
interval Prometheus stored a metric at (the step a `source: triton` trigger is replayed on)."""
from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Mapping, Sequence

from core.promql import render_query
from core.query import Series
from core.signal import Signal, SignalSource
from policies.schema import AlertTrigger

ALERT_LABELS_DROPPED = frozenset({"__name__", "alertstate"})


def alerts_query(trigger: AlertTrigger, values: Mapping[str, str]) -> str:
    """`ALERTS{alertname=..., alertstate="firing", <matchers>}`: the rule's firing samples."""
    matchers = {"alertname": trigger.name, "alertstate": "firing", **trigger.matchers}
    if trigger.target_label is not None and "model" in values:  # only the target's own alerts
        matchers.setdefault(trigger.target_label, values["model"])
    body = ", ".join(f'{k}="{_escape(render_query(v, values))}"' for k, v in matchers.items())
    return f"ALERTS{{{body}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def firing_onsets(series: Sequence[Series], step: float) -> list[tuple[float, dict[str, str]]]:
    """(moment, alert labels) of every start of firing: a series' first sample, or one after a
    gap of more than two steps (the alert resolved and fired again), in time order."""
    out = []
    for s in series:
        labels = {k: v for k, v in s.labels.items() if k not in ALERT_LABELS_DROPPED}
        last: float | None = None
        for t in s.timestamps:
            if last is None or t - last > 2 * step:
                out.append((t, labels))
            last = t
    out.sort(key=lambda item: item[0])
    return out


def alert_signal_at(at: float, labels: Mapping[str, str]) -> Signal:
    """The Signal the webhook would have carried for an alert firing from `at`."""
    blob = "\x00".join(f"{k}\x01{v}" for k, v in sorted(labels.items()))  # as the webhook intake
    fp = hashlib.sha256(blob.encode()).hexdigest()[:16]
    started = datetime.fromtimestamp(at, timezone.utc)
    return Signal(SignalSource.ALERT, labels.get("alertname", ""), dict(labels), started,
                  f"alert:{fp}:{started.isoformat()}:firing",
                  details={"fingerprint": fp, "replayed_from": "ALERTS"})


COUNT_WINDOW = 60.0
"""The widest window samples are counted over (`count_over_time(q[60s])`) to find where they are."""


def densest_window(counts: Sequence[Series]) -> tuple[float, float] | None:
    """(end, samples) of the window holding the most samples, from `count_over_time(metric[w])`
    at steps of `w`; None when no sample was stored."""
    best: tuple[float, float] | None = None
    for s in counts:
        for t, v in zip(s.timestamps, s.values):
            if v > 0 and (best is None or v > best[1]):
                best = (t, v)
    return best


def scrape_interval(stamps: Sequence[Series]) -> float | None:
    """Prometheus' scrape interval from `timestamp(metric)` read at a step finer than it: the
    median gap between the distinct sample times, to 0.1 s; None with fewer than two samples."""
    gaps: list[float] = []
    for s in stamps:
        seen = sorted({v for v in s.values if v == v})
        gaps.extend(b - a for a, b in zip(seen, seen[1:]))
    if not gaps:
        return None
    gaps.sort()
    return max(0.1, round(gaps[len(gaps) // 2], 1))
