"""Bad canary input is a reason on the detection, never a verdict (so never a shift): a canary
that got no requests, a canary the route names but whose series are missing, a series without the
version label, weights that do not sum to 100, a subset the DestinationRule lacks."""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

from core.query import Series
from detectors.canary import TailCanaryDetector
from tests.unit.test_canary_judge import DR, Cluster, _histogram, _vs


def _detect(series: list[tuple[Series, Series]], cluster: Mapping[str, Any] | None = None) -> list[Any]:
    det = TailCanaryDetector({"line": 500, "evidence": "histogram",
                              "virtualService": {"namespace": "serving", "name": "ranker"}})
    asyncio.run(det.observe_cluster(Cluster(cluster or {"virtualservices": _vs({"v1": 90, "v2": 10}),
                                                        "destinationrules": DR})))
    now = series[0][0].timestamps[-1]
    return det.detect_many([s for s, _ in series], now, [c for _, c in series])


def test_a_canary_with_no_traffic_gets_no_verdict():
    found = _detect([_histogram(0.0, 360.0, "1"), _histogram(0.0, 0.0, "2")])
    assert not any(d.fired for d in found)
    assert found[1].reason.startswith("not decided") and "no data" in found[1].reason
    assert "canary v2 (version 2, 10%) not judged" in found[0].reason and "no traffic reached it?" in found[0].reason


def test_a_canary_without_series_is_named_on_the_stable():
    (stable,) = _detect([_histogram(0.0, 360.0, "1")])
    assert not stable.fired and "canary v2 (version 2, 10%) not judged" in stable.reason
    assert stable.details["unjudged"] == ["2"]


def test_a_series_without_the_version_label_is_not_judged():
    bucket, count = _histogram(0.05, 40.0, "2")
    bare = Series({k: v for k, v in bucket.labels.items() if k != "version"}, bucket.timestamps, bucket.values)
    found = _detect([_histogram(0.0, 360.0, "1"), (bare, count)])
    assert not any(d.fired for d in found) and "no 'version' label" in found[1].reason


def test_weights_not_summing_to_100_or_a_missing_subset_give_no_verdict():
    for vs, reason in ((_vs({"v1": 95, "v2": 10}), "sum to 105"),
                       (_vs({"v1": 90, "v9": 10}), "'v9' of VirtualService")):
        found = _detect([_histogram(0.0, 360.0, "1"), _histogram(0.05, 40.0, "2")],
                        {"virtualservices": vs, "destinationrules": DR})
        assert not any(d.fired for d in found)
        assert all(d.reason.startswith("no canary verdict") and reason in d.reason for d in found)
