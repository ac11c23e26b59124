"""Detector gauges in /metrics: value, baseline, threshold, score and fired per policy, trigger and
series, with a cap on series per policy (new ones counted as dropped), idle series giving way."""
from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest

from core.detection import Detection
from daemon.common.metrics import DetectorGauges
from daemon.workers.poller import gauge_series


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_one_evaluation_sets_five_gauges():
    """The numbers behind the verdict; what a detector does not have reads NaN."""
    r = CollectorRegistry()
    gauges = DetectorGauges(r)
    d = Detection("threshold", True, "5/5 above", value=900.0, threshold=500.0)
    assert gauges.observe("ranker-tail", 0, "model=ranker", d, 100.0)
    labels = {"policy": "ranker-tail", "trigger": "0", "detector": "threshold", "series": "model=ranker"}
    assert _sample(r, "tailguard_detector_value", **labels) == 900.0
    assert _sample(r, "tailguard_detector_threshold", **labels) == 500.0
    assert _sample(r, "tailguard_detector_fired", **labels) == 1.0
    assert math.isnan(_sample(r, "tailguard_detector_baseline", **labels) or 0.0)
    gauges.observe("ranker-tail", 0, "model=ranker", Detection("threshold", False, "ok", value=100.0), 115.0)
    assert _sample(r, "tailguard_detector_fired", **labels) == 0.0


def test_cap_per_policy_counts_dropped_and_idle_series_give_way():
    """Past the cap a new series is dropped (counted); a series idle past idle_seconds is removed
    when a new one needs its place; another policy has its own cap."""
    r = CollectorRegistry()
    gauges = DetectorGauges(r, max_series_per_policy=2, idle_seconds=60.0)
    d = Detection("threshold", False, "ok", value=1.0)
    assert gauges.observe("p", 0, "pod=a", d, 0.0)
    assert gauges.observe("p", 0, "pod=b", d, 0.0)
    assert not gauges.observe("p", 0, "pod=c", d, 30.0)
    assert gauges.observe("other", 0, "pod=c", d, 30.0)
    assert _sample(r, "tailguard_detector_series_dropped_total", policy="p") == 1.0
    assert gauges.observe("p", 0, "pod=b", d, 90.0)  # b stays fresh, a goes idle
    assert gauges.observe("p", 0, "pod=c", d, 90.0)  # a (idle 90 s) gives way to c
    text = generate_latest(r).decode()
    assert 'series="pod=a"' not in text and 'series="pod=c"' in text
    assert len([line for line in text.splitlines() if line.startswith("tailguard_detector_value{")]) == 3


def test_gauge_series_is_readable():
    """Sorted k=v pairs without the metric name; no labels at all reads {}."""
    assert gauge_series({"model": "ranker", "__name__": "x", "instance": "a:8002"}) == "instance=a:8002,model=ranker"
    assert gauge_series({}) == "{}"


def test_idle_series_are_looked_for_once_per_cycle():
    """A cycle past the cap (one `now`) scans the policy's exported series for idle ones once, not
    once per new series: after that scan none can be idle at the same `now`."""
    gauges = DetectorGauges(CollectorRegistry(), max_series_per_policy=3, idle_seconds=60.0)
    d = Detection("threshold", False, "ok", value=1.0)
    for pod in "abc":
        gauges.observe("p", 0, f"pod={pod}", d, 0.0)
    scans: list[float] = []
    evict = gauges._evict_idle

    def counted(policy: str, seen: dict[tuple[str, str, str], float], now: float) -> None:
        scans.append(now)
        evict(policy, seen, now)

    gauges._evict_idle = counted  # type: ignore[method-assign]
    gauges.observe("p", 0, "pod=a", d, 90.0)  # a stays
    placed = [gauges.observe("p", 0, f"pod=n{i}", d, 90.0) for i in range(100)]
    assert placed[:2] == [True, True] and not any(placed[2:])  # b and c gave way, then the cap holds
    assert scans == [90.0]
    assert gauges.observe("p", 0, "pod=late", d, 200.0) and scans == [90.0, 200.0]
