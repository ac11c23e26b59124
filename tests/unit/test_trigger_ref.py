"""A Signal's typed reference to the trigger that produced it (`core.signal.TriggerRef`): written by
the poller, journaled in the summary and read back; a summary journaled before signals carried it
still reads (derived from the signal); planning finds the detector trigger that spoke by it."""
from __future__ import annotations

import json
from datetime import datetime, timezone

from core.query import Series
from core.detection import Detection, RecoveryLine, Side
from core.signal import Signal, SignalSource, TriggerRef
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.poller import Watch, detection_signal
from detectors.registry import DETECTORS
from policies.loader import load_policies_text
from policies.planning import recovery_check

AT = datetime(2026, 12, 6, 17, 0, tzinfo=timezone.utc)
POLICY = """
name: p
target: {model: ranker, triton: {endpoints: ["http://127.0.0.1:9"]}}
triggers:
  - detector: {type: tail_anomaly, query: 'a{model="$model"}', params: {min_absolute_increase: 100000}}
  - detector: {type: tail_anomaly, query: 'a{model="$model"}', interval: 30s,
               params: {min_absolute_increase: 100000}}
actions:
  - {type: triton.rollback, to: previous}
"""


def test_a_detector_signal_names_its_trigger_and_the_summary_keeps_it():
    (policy,) = load_policies_text(POLICY, "p.yaml", action_registry(), detector_registry()).policies
    bound = policy.detectors[1]
    watch = Watch(policy, bound, DETECTORS[bound.trigger.type](bound.params), "fp", scoped=True)
    detection = Detection("tail_anomaly", True, "P99.9 up", value=900.0, threshold=300.0)
    signal = detection_signal(watch, Series({"model": "ranker"}, (1.0,), (900.0,)), detection, 1.0)
    assert signal.trigger == TriggerRef(SignalSource.DETECTOR, 1, "tail_anomaly")
    summary = json.loads(signal.summary_json())
    assert summary["trigger"] == {"kind": "detector", "index": 1, "name": "tail_anomaly"}
    back = Signal.from_summary(summary)
    assert back.trigger == signal.trigger and back == Signal.from_summary(signal.summary())


def test_planning_finds_the_trigger_the_reference_names_where_the_query_cannot_tell():
    """Both triggers share a query: only the reference says the second spoke (its interval, 30 s,
    is the recovery check's)."""
    (policy,) = load_policies_text(POLICY, "p.yaml", action_registry(), detector_registry()).policies
    signal = Signal(SignalSource.DETECTOR, "tail_anomaly", {"model": "ranker"}, AT, "detector:p:1:abc", policy="p",
                    details={"query": 'a{model="$model"}', "threshold": 300.0},
                    recovery_line=RecoveryLine(300.0, Side.BELOW, "threshold"),
                    trigger=TriggerRef(SignalSource.DETECTOR, 1, "tail_anomaly"))
    check = recovery_check(policy, signal)
    assert check is not None and check.interval == 30.0
    first = recovery_check(policy, Signal(SignalSource.DETECTOR, "tail_anomaly", {"model": "ranker"}, AT,
                                          "detector:p:0:abc", policy="p", details=signal.details,
                                          recovery_line=signal.recovery_line))
    assert first is not None and first.interval == 15.0  # no reference: derived from the dedup key


def test_a_summary_journaled_before_the_reference_still_reads_and_derives_it():
    old = {"source": "detector", "name": "tail_excess", "labels": {"model": "ranker"},
           "observed_at": AT.isoformat(), "dedup_key": "detector:ranker-tail:0:0123abcd", "status": "firing",
           "value": 1.0, "policy": "ranker-tail", "details": {"input": "counters"}, "recovery_line": None}
    signal = Signal.from_summary(old)
    assert signal.trigger is None and "trigger" not in signal.summary()  # written back as it was
    assert signal.trigger_ref() == TriggerRef(SignalSource.DETECTOR, 0, "tail_excess")
    alert = Signal.from_summary({**old, "source": "alert", "name": "TritonTailLatencyHigh", "dedup_key": "fp"})
    assert alert.trigger_ref() == TriggerRef(SignalSource.ALERT, None, "TritonTailLatencyHigh")
    tick = Signal.from_summary({**old, "source": "schedule", "name": "schedule", "dedup_key": "schedule:p:2:99"})
    assert tick.trigger_ref() == TriggerRef(SignalSource.SCHEDULE, 2, "schedule")
    odd = Signal.from_summary({**old, "dedup_key": "not-a-detector-key"})
    assert odd.trigger_ref() == TriggerRef(SignalSource.DETECTOR, None, "tail_excess")


def test_an_alert_summary_is_unchanged_by_the_reference():
    """Alerts carry none at intake (it is derived): the webhook's summaries stay as they were."""
    alert = Signal(SignalSource.ALERT, "TritonTailLatencyHigh", {"model": "ranker"}, AT, "fp",
                   details={"fingerprint": "fp"})
    assert "trigger" not in json.loads(alert.summary_json())
