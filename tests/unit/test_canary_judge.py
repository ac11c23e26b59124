"""The canary judge: roles from the VirtualService, a canary worse than its stable fires, a healthy
canary and a shared slowdown do not, and bad topology or labels are reasons, never a verdict."""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

import numpy as np
import pytest

from core.canary import CanaryRoles, canary_roles
from core.query import Series
from detectors.canary import TailCanaryDetector
from detectors.registry import DETECTORS
from detectors.sequential.thresholds import STORE

START = 1_767_225_600.0


def _vs(weights: Mapping[str, int], route: str = "primary") -> dict[str, Any]:
    return {"spec": {"http": [{"name": route, "route": [
        {"destination": {"host": "ranker", "subset": s}, "weight": w} for s, w in weights.items()]}]}}


DR = {"spec": {"subsets": [{"name": "v1", "labels": {"version": "1"}}, {"name": "v2", "labels": {"version": "2"}}]}}


def test_roles_come_from_the_route_and_the_destination_rule():
    roles = canary_roles(_vs({"v1": 90, "v2": 10}), "primary", DR, None, "version", "serving/ranker")
    assert isinstance(roles, CanaryRoles)
    assert (roles.stable.subset, roles.stable.version) == ("v1", "1")
    assert [(c.subset, c.version, c.weight) for c in roles.canaries] == [("v2", "2", 10)]
    mapped = canary_roles(_vs({"v1": 10, "v2": 90}), None, None, {"v1": "a", "v2": "b"}, "version", "x")
    assert isinstance(mapped, CanaryRoles) and mapped.stable.version == "b"


@pytest.mark.parametrize("vs, route, dr, versions, reason", [
    (None, None, DR, None, "no VirtualService"),
    (_vs({"v1": 90, "v2": 20}), None, DR, None, "sum to 110"),
    (_vs({"v1": 100}), None, DR, None, "one destination"),
    (_vs({"v1": 90, "v3": 10}), None, DR, None, "'v3' of VirtualService"),
    (_vs({"v1": 50, "v2": 50}), None, DR, None, "no destination carries the most weight"),
    (_vs({"v1": 90, "v2": 10}), "other", DR, None, "no http route 'other'"),
    (_vs({"v1": 90, "v2": 10}), None, None, None, "none found"),
])
def test_topology_that_cannot_tell_roles_is_a_reason(vs, route, dr, versions, reason):
    found = canary_roles(vs, route, dr, versions, "version", "serving/ranker")
    assert isinstance(found, str) and reason in found


class Cluster:
    def __init__(self, objects: Mapping[str, Any]) -> None:
        self.objects = objects

    async def get(self, group: str, version: str, plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objects.get(plural)


def _histogram(share: float, requests_per_s: float, version: str, seconds: int = 600, seed: int = 1
               ) -> tuple[Series, Series]:
    rng = np.random.default_rng(seed)
    requests = np.full(seconds, requests_per_s)
    above = rng.poisson(requests * share).astype(float)
    ts = tuple(START + np.arange(seconds + 1, dtype=float))
    labels = {"model": "ranker", "version": version}
    bucket = np.concatenate([[0.0], np.cumsum(requests - above)])
    count = np.concatenate([[0.0], np.cumsum(requests)])
    return (Series({"__name__": "b", **labels, "le": "500.0"}, ts, tuple(bucket)),
            Series({"__name__": "c", **labels}, ts, tuple(count)))


def _judge(stable_share: float, canary_share: float, weight: float = 0.1, rate: float = 400.0,
           cluster: Mapping[str, Any] | None = None, drop_label: bool = False):
    det = TailCanaryDetector({"line": 500, "evidence": "histogram",
                              "virtualService": {"namespace": "serving", "name": "ranker"}})
    asyncio.run(det.observe_cluster(Cluster(cluster or {"virtualservices": _vs({"v1": 90, "v2": 10}),
                                                        "destinationrules": DR})))
    s = _histogram(stable_share, rate * (1 - weight), "1", seed=2)
    c = _histogram(canary_share, rate * weight, "2", seed=3)
    if drop_label:
        c = (Series({k: v for k, v in c[0].labels.items() if k != "version"}, c[0].timestamps, c[0].values), c[1])
    now = s[0].timestamps[-1]
    det.detect_many([s[0], c[0]], now, [s[1], c[1]])
    assert STORE.wait()
    return det.detect_many([s[0], c[0]], now, [s[1], c[1]])


def test_registered_as_its_own_type():
    assert DETECTORS["tail_canary"] is TailCanaryDetector


@pytest.mark.slow  # derives the thresholds of the canary's reference
def test_a_canary_with_the_reference_defect_is_worse_than_its_stable():
    stable, canary = _judge(0.0, 0.005)
    assert not stable.fired and stable.details["role"] == "stable"
    assert canary.fired and canary.reason.startswith("canary worse than the stable")
    assert canary.details["version"] == "2" and canary.details["stable"] == "1"


@pytest.mark.slow  # derives the thresholds of the canary's reference
def test_a_healthy_canary_at_half_budget_beside_a_healthy_stable_is_not():
    _, canary = _judge(0.0005, 0.0005)
    assert not canary.fired and "shared slowdown" not in canary.reason


@pytest.mark.slow  # derives the thresholds of the canary's reference
def test_a_shared_slowdown_fires_neither_and_says_so():
    _, canary = _judge(0.02, 0.02)
    assert not canary.fired and canary.reason.startswith("shared slowdown")
    assert canary.details["shared_slowdown"] == ["1", "2"]


@pytest.mark.slow  # derives the thresholds of the canary's reference
def test_bad_topology_or_labels_give_no_verdict():
    bad = _judge(0.0, 0.02, cluster={"virtualservices": _vs({"v1": 80, "v2": 10}), "destinationrules": DR})
    assert not any(d.fired for d in bad) and "sum to 90" in bad[0].reason
    unlabelled = _judge(0.0, 0.02, drop_label=True)
    assert not any(d.fired for d in unlabelled)
    assert "no 'version' label" in unlabelled[1].reason


@pytest.mark.slow  # derives the thresholds of the canary's reference
def test_a_burst_on_the_canary_during_a_shared_slowdown_is_not_its_fault():
    """Both versions at 0.35% above the line (a CPU-starved host), and a stall that put 20 of the
    canary's requests above the line in a few seconds: a large member may see the burst, but the
    canary's share is not shown above the stable's, so it is a shared slowdown (lab run, 600 s)."""
    det = TailCanaryDetector({"line": 500, "evidence": "histogram",
                              "virtualService": {"namespace": "serving", "name": "ranker"}})
    asyncio.run(det.observe_cluster(Cluster({"virtualservices": _vs({"v1": 90, "v2": 10}), "destinationrules": DR})))
    s = _histogram(0.0035, 180.0, "1", seed=2)
    bucket, count = _histogram(0.0035, 20.0, "2", seed=3)
    burst = np.concatenate([np.zeros(590), np.full(5, 4.0), np.full(6, 20.0)])  # 20 more above, from t=590 s
    c = (Series(bucket.labels, bucket.timestamps, tuple(np.asarray(bucket.values) - burst)), count)
    now = s[0].timestamps[-1]
    det.detect_many([s[0], c[0]], now, [s[1], c[1]])
    assert STORE.wait()
    _, canary = det.detect_many([s[0], c[0]], now, [s[1], c[1]])
    assert not canary.fired and canary.reason.startswith("shared slowdown"), canary.reason


def _onset(after_stable: float, after_canary: float, onset: int = 780, seconds: int = 900, rate: float = 400.0):
    """Both versions at half budget until `onset` s, then at their `after` shares (the lookback's end)."""
    det = TailCanaryDetector({"line": 500, "evidence": "histogram",
                              "virtualService": {"namespace": "serving", "name": "ranker"}})
    asyncio.run(det.observe_cluster(Cluster({"virtualservices": _vs({"v1": 90, "v2": 10}), "destinationrules": DR})))
    pairs = []
    for version, per_s, after, seed in (("1", rate * 0.9, after_stable, 4), ("2", rate * 0.1, after_canary, 5)):
        rng = np.random.default_rng(seed)
        requests = np.full(seconds, per_s)
        share = np.where(np.arange(seconds) < onset, 0.0005, after)
        above = rng.poisson(requests * share).astype(float)
        ts = tuple(START + np.arange(seconds + 1, dtype=float))
        labels = {"model": "ranker", "version": version}
        pairs.append((Series({"__name__": "b", **labels, "le": "500.0"}, ts,
                             tuple(np.concatenate([[0.0], np.cumsum(requests - above)]))),
                      Series({"__name__": "c", **labels}, ts, tuple(np.concatenate([[0.0], np.cumsum(requests)])))))
    now = START + seconds
    det.detect_many([pairs[0][0], pairs[1][0]], now, [pairs[0][1], pairs[1][1]])
    assert STORE.wait()
    return det.detect_many([pairs[0][0], pairs[1][0]], now, [pairs[0][1], pairs[1][1]])[1]


@pytest.mark.slow  # derives the thresholds of the canary's reference
def test_a_shared_onset_is_judged_over_the_canarys_episode_not_the_lookback():
    # 2 minutes into a slowdown of both, the stable's lookback average is still near half budget:
    # only the stable's share over the canary's own episode shows the canary is no worse.
    assert not _onset(0.005, 0.005).fired
    assert _onset(0.0005, 0.005).fired  # the same onset on the canary alone is its defect
