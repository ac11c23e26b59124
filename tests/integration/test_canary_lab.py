"""Issue 23 evidence: the lab's canary scenarios end to end (`python -m lab.demo --scenario ... --short`)
on one real Triton serving v1 and v2, real Prometheus scraping the Istio-shaped histogram, the
clients routed by the VirtualService the Kubernetes API emulator holds, and
examples/policies/canary.yaml run as it is:
- canary: a defect on v2 at 10% (2% of its requests 900 ms slower; the reference defect's 0.5% is
  bench_canary's to time): the judge (tail_canary) fires, the weights go back to v1 100 / v2 0 and
  the timeout is retuned, and verify says recovered;
- canary-healthy: a good canary serves the whole short watch and nothing is applied;
- canary-shared: both versions slow down together, with the tail rollback policy on the same
  target too: nothing is applied, the weights stay at 90/10, the journal says "shared slowdown", and
  no detector signal was raised.

The three run side by side as subprocesses (each its own servers on free ports); each is stopped
by its PID if it overstays its bound. The full 600 s healthy run is a one-off (docs/canary.md).
"""
from __future__ import annotations

from typing import Any

import pytest

from tests.support.demo_runs import run_demos

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIOS = ("canary", "canary-healthy", "canary-shared")
BOUND_SECONDS = 600.0
"""Per scenario, far above a short run (~3 min on 2 cores): a hang fails, it never blocks CI."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Start the short demos at once, wait (bounded) for each, and read their JSON summaries."""
    return run_demos(tmp_path_factory.mktemp("demo"), SCENARIOS, BOUND_SECONDS)


def first(markers: list[dict[str, Any]], kind: str) -> float:
    return min(m["t"] for m in markers if m["kind"] == kind)


def test_bad_canary_is_judged_shifted_back_and_verified(runs: dict[str, dict[str, Any]]) -> None:
    run = runs["canary"]
    markers = run["markers"]
    # The lab's page alert on Triton's P99.9 is a marker only here: no policy acts on it.
    detection = next(m for m in markers if m["kind"] == "detection" and m["label"].startswith("detector/"))
    assert detection["label"] == "detector/tail_canary"
    times = [first(markers, "deploy"), detection["t"], *(first(markers, k) for k in ("action", "verification",
                                                                                     "recovery"))]
    assert times == sorted(times), markers
    assert "VERDICT: canary worse than the stable: canary v2" in run["log"]
    final = run["final_objects"]
    assert final["weights"] == {"v1": 100, "v2": 0}
    assert final["timeout"] != "30s" and 2000 <= final["timeout_ms"] <= 30000
    labels = [m["label"] for m in markers if m["kind"] == "action"]
    assert any(label.startswith("istio.shift_weights") for label in labels)
    assert any(label.startswith("gateway.retune_timeout") for label in labels)
    assert run["verdict"] == "recovered"


def test_healthy_canary_is_never_shifted(runs: dict[str, dict[str, Any]]) -> None:
    final = runs["canary-healthy"]["final_objects"]
    assert final["weights"] == {"v1": 90, "v2": 10} and final["timeout"] == "30s"
    assert final["journal"]["applied"] == 0
    assert not [m for m in runs["canary-healthy"]["markers"] if m["kind"] == "action"]


def test_shared_slowdown_shifts_and_rolls_back_nothing_and_the_journal_says_why(
        runs: dict[str, dict[str, Any]]) -> None:
    run = runs["canary-shared"]
    final = run["final_objects"]
    assert final["weights"] == {"v1": 90, "v2": 10} and final["timeout"] == "30s"
    assert final["journal"]["applied"] == 0
    assert not [m for m in run["markers"] if m["kind"] == "action"]
    decisions = final["journal"]["decisions"]
    assert decisions, "the page alert fired on the shared slowdown: the tail rollback must journal why it held"
    assert all(not d["executed"] for d in decisions)
    # The alert is governed (policies/governance.py): while tail_excess sees the target it only notifies.
    assert any(d["policy"] == "ranker-tail" and d["reason"].startswith("notify only: the governing detector")
               for d in decisions), decisions
    # Neither detector fired: the judge saw the stable as slow, and tail_excess held the busier
    # version's alarm until the quieter one showed its share (a shared slowdown), not only the
    # attribution guard stopping the rollback of v1.
    assert final["journal"]["detector_signals"] == [], final["journal"]
