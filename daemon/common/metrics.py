"""The daemon's own Prometheus metrics, on a registry per app (no global state)."""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
                                   "1 when the last Prometheus query succeeded.", registry=r)
        self.stale_queries = Gauge("tailguard_stale_queries",
                                   "Detector queries whose data is stale (Prometheus failing).",
                                   registry=r)
        self.detections = Counter("tailguard_detections_total", "Detector verdicts by policy and result.",
                                  ["policy", "detector", "fired"], registry=r)
        self.is_leader = Gauge("tailguard_is_leader", "1 when this replica may act.", registry=r)
        self.frozen = Gauge("tailguard_frozen", "1 when the global freeze switch is on.", registry=r)
        self.faults = Counter("tailguard_faults_total", "Internal faults recorded, by component.",
                              ["component"], registry=r)
