"""The daemon's own Prometheus metrics, on a registry per app (no global state)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core.detection import Detection

DETECTOR_SERIES_PER_POLICY = 50
"""Series per policy whose detector gauges are exported; past it new series are counted as dropped."""
DETECTOR_SERIES_IDLE_SECONDS = 900.0
"""A series not evaluated for this long gives its place to a new one (pods come and go)."""


class DetectorGauges:
    """What each detector saw and decided on its last evaluation, per policy, trigger and series:
    value, baseline, threshold, score (NaN when the detector has none) and fired (0/1).

    Cardinality is bounded: at most `max_series_per_policy` series per policy; a series idle for
    `idle_seconds` is removed when a new one needs its place, and a series that finds no place is
    counted in `tailguard_detector_series_dropped_total`. Cost: five gauge sets per series per cycle.
    """

    LABELS = ("policy", "trigger", "detector", "series")

    def __init__(self, registry: CollectorRegistry, max_series_per_policy: int = DETECTOR_SERIES_PER_POLICY,
                 idle_seconds: float = DETECTOR_SERIES_IDLE_SECONDS) -> None:
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"tailguard_detector_{name}", doc, self.LABELS, registry=registry)

        self.value = gauge("value", "The series' latest value as the detector judged it.")
        self.baseline = gauge("baseline", "The detector's baseline for the series (NaN: none).")
        self.threshold = gauge("threshold", "The line the detector fires across (NaN: none).")
        self.score = gauge("score", "The detector's score for the series (NaN: none).")
        self.fired = gauge("fired", "1 when the detector fired on its last evaluation of the series.")
        self.dropped = Counter("tailguard_detector_series_dropped_total",
                               "Detector evaluations not exported because the policy's series cap was reached.",
                               ["policy"], registry=registry)
        self.max_series_per_policy = max_series_per_policy
        self.idle_seconds = idle_seconds
        self._seen: dict[str, dict[tuple[str, str, str], float]] = {}  # policy -> (trigger, detector, series) -> at
        self._evicted: dict[str, float] = {}  # policy -> the `now` of its last eviction pass

    def observe(self, policy: str, trigger: int, series: str, d: Detection, now: float) -> bool:
        """Export one evaluation; False when the policy's cap left no place for this series."""
        if self._export(policy, self._seen.setdefault(policy, {}), (str(trigger), d.detector, series), d, now):
            return True
        self.dropped.labels(policy).inc()
        return False

    def observe_many(self, policy: str, trigger: int, series: Iterable[str], detections: Sequence[Detection],
                     now: float) -> int:
        """`observe` of each (series, detection) pair in order; returns how many found no place.
        The dropped ones are counted with one increment: one per series past the cap looked the
        labelled child up thousands of times a cycle (the same count: sums of ones are exact)."""
        seen, index = self._seen.setdefault(policy, {}), str(trigger)
        dropped = 0
        try:
            for name, d in zip(series, detections):
                if not self._export(policy, seen, (index, d.detector, name), d, now):
                    dropped += 1
        finally:  # counted also when a later pair raises, as one by one
            if dropped:
                self.dropped.labels(policy).inc(dropped)
        self.forget(policy, trigger, keep_at=now)  # a series gone from the answer: its gauges go with it
        return dropped

    def forget(self, policy: str, trigger: int, keep_at: float | None = None) -> int:
        """Remove the gauges of a policy's trigger (those not evaluated at `keep_at`, or all): data
        that went away (a failed query, a vanished series) must not keep showing its last values."""
        seen, index = self._seen.get(policy, {}), str(trigger)
        gone = [k for k, at in seen.items() if k[0] == index and (keep_at is None or at != keep_at)]
        for key in gone:
            del seen[key]
            self._remove(policy, key)
        return len(gone)

    def _remove(self, policy: str, key: tuple[str, str, str]) -> None:
        for gauge in (self.value, self.baseline, self.threshold, self.score, self.fired):
            try:
                gauge.remove(policy, *key)
            except KeyError:  # never set (a failed set): nothing to remove
                pass

    def _export(self, policy: str, seen: dict[tuple[str, str, str], float], key: tuple[str, str, str],
                d: Detection, now: float) -> bool:
        """Sets the gauges of `key` (trigger, detector, series) unless the cap leaves no place."""
        if key not in seen and len(seen) >= self.max_series_per_policy:
            if self._evicted.get(policy) != now:  # once per cycle: a cycle past the cap has one `now`
                self._evicted[policy] = now
                self._evict_idle(policy, seen, now)
            if len(seen) >= self.max_series_per_policy:
                return False
        seen[key] = now
        labels = (policy, *key)
        self.value.labels(*labels).set(_number(d.value))
        self.baseline.labels(*labels).set(_number(d.baseline))
        self.threshold.labels(*labels).set(_number(d.threshold))
        self.score.labels(*labels).set(_number(d.score))
        self.fired.labels(*labels).set(int(d.fired))
        return True

    def _evict_idle(self, policy: str, seen: dict[tuple[str, str, str], float], now: float) -> None:
        for key in [k for k, at in seen.items() if now - at > self.idle_seconds]:
            del seen[key]
            self._remove(policy, key)


def _number(value: float | None) -> float:
    return float(value) if value is not None and math.isfinite(value) else math.nan


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.webhooks = Counter("tailguard_webhooks_total", "Webhook requests by HTTP status.",
                                ["code"], registry=r)
        self.http_responses = Counter("tailguard_http_responses_total",
                                      "HTTP responses by route and status (unknown paths: route \"unmatched\").",
                                      ["route", "code"], registry=r)
        self.alerts_received = Counter("tailguard_alerts_received_total",
                                       "Alerts received in webhooks, by status.", ["status"], registry=r)
        self.alerts_deduplicated = Counter("tailguard_alerts_deduplicated_total",
                                           "Alerts already journaled (Alertmanager resends).", registry=r)
        self.signals = Counter("tailguard_signals_total", "Signals journaled, by source and name.",
                               ["source", "name"], registry=r)
        self.matched = Counter("tailguard_signals_matched_total", "Signals that matched a policy.",
                               ["policy"], registry=r)
        self.decisions = Counter("tailguard_decisions_total", "Decisions by policy and state.",
                                 ["policy", "state"], registry=r)
        self.actions = Counter("tailguard_actions_total", "Action steps by action and result.",
                               ["action", "result"], registry=r)
        self.action_duration = Histogram("tailguard_action_duration_seconds",
                                         "Duration of action apply+verify.", ["action"], registry=r,
                                         buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.policies_loaded = Gauge("tailguard_policies_loaded", "Policies in the active set.",
                                     registry=r)
        self.policy_reload_errors = Counter("tailguard_policy_reload_errors_total",
                                            "Policy reloads rejected as invalid.", registry=r)
        self.prometheus_up = Gauge("tailguard_prometheus_up",
                                   "0 when every Prometheus query group's last fetch failed (Prometheus away); "
                                   "a partial failure shows in tailguard_query_up.", registry=r)
        self.prometheus_up.set(1)
        self.query_up = Gauge("tailguard_query_up",
                              "Per detector query group: 1 when its last fetch succeeded from every source, "
                              "0 when it failed or some source (a Triton replica) could not be read.",
                              ["group", "source"], registry=r)
        self.stale_queries = Gauge("tailguard_stale_queries",
                                   "Detector query groups whose data is stale or partial (their source failing).",
                                   registry=r)
        self.no_data = Gauge("tailguard_detector_no_data",
                             "1 while a policy's detector trigger gets no series for its model (its metrics "
                             "vanished: the target is not watched by it).", ["policy", "trigger"], registry=r)
        self.detections = Counter("tailguard_detections_total", "Detector verdicts by policy and result.",
                                  ["policy", "detector", "fired"], registry=r)
        self.is_leader = Gauge("tailguard_is_leader", "1 when this replica may act.", registry=r)
        self.journal_up = Gauge("tailguard_journal_up",
                                "0 while journal writes fail (or one is stalled) past journal.writeFailureSeconds: "
                                "the replica is not ready and does not lead.", registry=r)
        self.journal_up.set(1)
        self.clock_step = Gauge("tailguard_clock_step_seconds",
                                "How far the system clock has stepped since the daemon started (system minus the "
                                "daemon's steady clock); the daemon's windows do not follow steps.", registry=r)
        self.frozen = Gauge("tailguard_frozen", "1 when the global freeze switch is on.", registry=r)
        self.shadow_decisions = Counter("tailguard_shadow_decisions_total",
                                        "Decisions of shadow triggers (never applied), by policy and what "
                                        "would have happened: act, blocked, silenced, noop, fail.",
                                        ["policy", "would"], registry=r)
        self.governed_alerts = Counter("tailguard_governed_alerts_total",
                                       "Alert signals ruled by the governed alert rule on a policy with a rollback-class "
                                       "action, by policy and outcome: notify (journaled, not acted on), backstop "
                                       "(acted: the governing detector was blind), ungoverned, vetoed, free.",
                                       ["policy", "outcome"], registry=r)
        self.silence_checks = Counter("tailguard_silence_checks_total",
                                      "Alertmanager silence checks before acting on a detector signal, by "
                                      "result: silenced, clear, unavailable (acted without them).",
                                      ["result"], registry=r)
        self.detector = DetectorGauges(r)
        self.faults = Counter("tailguard_faults_total", "Internal faults recorded, by component.",
                              ["component"], registry=r)
        self.loop_crashes = Counter("tailguard_loop_crashes_total",
                                    "Crashes of the daemon's loops and their child tasks, by component; a "
                                    "crashed loop restarts with backoff (daemon/common/lifecycle.py).",
                                    ["component"], registry=r)
