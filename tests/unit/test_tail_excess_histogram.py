"""tail_excess on a histogram: what the policy alone shows is refused at load, bad buckets are
reasons (never a fire, never a raise), and the live detector decides on a trace what the
operating-curve benchmark's decider (the same decision core) decides."""
from __future__ import annotations

import numpy as np
import pytest

from core.query import Series
from detectors.sequential.thresholds import STORE
from detectors.tail_excess import TailExcessDetector, TailExcessParams
from evaluation.operating_curve.arrivals import Fault, seeded_run
from evaluation.operating_curve.deciders import Tailguard
from evaluation.operating_curve.traffic import Traffic
from policies.loader import PolicyLoadError, load_policies_text
from daemon.wiring.registries import action_registry, detector_registry

START = 1_767_225_600.0
POLICY = """
name: p
target: {{model: ranker, triton: {{endpoints: ["http://127.0.0.1:9"]}}}}
triggers:
  - detector:
      type: tail_excess
      query: '{query}'
      {companion}
      params: {{line: 500, evidence: histogram}}
actions:
  - {{type: triton.rollback, to: previous}}
verify: {{query: up, below: 1}}
"""


def _load(query: str, companion: str | None = "h_count{model=\"$model\"}") -> None:
    text = POLICY.format(query=query, companion=f"companionQuery: '{companion}'" if companion else "")
    load_policies_text(text, "p.yaml", action_registry(), detector_registry())


@pytest.mark.parametrize("query, companion, message", [
    ('h_bucket{model="$model", le="500"}', None, "needs companionQuery"),
    ('h_bucket{model="$model"}', 'h_count{model="$model"}', "select the bucket at the line"),
    ('h_bucket{model="$model", le=~"500|1000"}', 'h_count{model="$model"}', "select the bucket at the line"),
    ('h_bucket{model="$model", le="250"}', 'h_count{model="$model"}', "le=250 is below the line 500"),
])
def test_the_policy_alone_shows_a_bucket_that_cannot_answer(query: str, companion: str | None, message: str):
    with pytest.raises(PolicyLoadError) as caught:
        _load(query, companion)
    assert message in str(caught.value) and "triggers[0].detector.query" in str(caught.value)


def test_the_bucket_at_or_above_the_line_loads():
    _load('h_bucket{model="$model", le="500.0"}')
    _load('h_bucket{model="$model", le="1000"}')


def _histogram(above: np.ndarray, requests: np.ndarray, le: str = "500.0", version: str = "2"
               ) -> tuple[Series, Series]:
    """Cumulative bucket (requests at or below the line) and count series from per-step numbers."""
    ts = tuple(START + np.arange(above.size + 1, dtype=float))
    bucket = np.concatenate([[0.0], np.cumsum(requests - above)])
    count = np.concatenate([[0.0], np.cumsum(requests)])
    labels = {"model": "ranker", "version": version}
    return (Series({"__name__": "h_bucket", **labels, "le": le}, ts, tuple(bucket)),
            Series({"__name__": "h_count", **labels}, ts, tuple(count)))


def _defect(seconds: int = 300, share: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    requests = np.full(seconds, 40.0)
    return rng.binomial(40, share, seconds).astype(float), requests


DET = TailExcessDetector({"line": 500, "evidence": "histogram"})


def _decide(bucket: Series, count: Series):
    DET.detect(bucket, bucket.timestamps[-1], count)
    assert STORE.wait()
    return DET.detect(bucket, bucket.timestamps[-1], count)


def test_a_defect_fires_on_exact_counts_and_names_the_bucket_above_the_line():
    above, requests = _defect()
    d = _decide(*_histogram(above, requests))
    assert d.fired and d.details["version"] == "2" and "bucket" not in d.details
    wide = _decide(*_histogram(above, requests, le="1000"))
    assert wide.fired and wide.details["bucket"] == 1000.0 and "nearest above the line" in wide.reason


def test_a_bucket_below_the_line_or_without_a_bound_never_fires():
    above, requests = _defect()
    below = _decide(*_histogram(above, requests, le="250"))
    assert not below.fired and "below the line" in below.reason
    bucket, count = _histogram(above, requests)
    bare = Series({k: v for k, v in bucket.labels.items() if k != "le"}, bucket.timestamps, bucket.values)
    d = _decide(bare, count)
    assert not d.fired and "no bucket bound" in d.reason


def test_a_bucket_counting_more_than_its_total_is_inconsistent():
    above, requests = _defect(120)
    bucket, count = _histogram(above, requests)
    # Bucket and count from different series: the bucket grows faster than every request there is.
    swapped = Series(bucket.labels, bucket.timestamps, tuple(2 * v for v in count.values))
    d = _decide(swapped, count)
    assert not d.fired and d.reason.startswith("inconsistent histogram")


def test_a_reset_is_one_step_left_out_not_a_burst_of_slow_requests():
    above, requests = np.zeros(300), np.full(300, 40.0)
    bucket, count = _histogram(above, requests)
    # A pod of a summed histogram restarts at 150: both counters drop to what the others had.
    drop = 4000.0
    b = tuple(v if i < 150 else v - drop for i, v in enumerate(bucket.values))
    c = tuple(v if i < 150 else v - drop for i, v in enumerate(count.values))
    d = _decide(Series(bucket.labels, bucket.timestamps, b), Series(count.labels, count.timestamps, c))
    assert not d.fired and d.details["counter_resets"] == 1 and d.details["window_above_line"] == 0.0


def test_no_count_is_a_reason():
    above, requests = _defect()
    bucket, _ = _histogram(above, requests)
    assert "companionQuery" in DET.detect(bucket, bucket.timestamps[-1], None).reason


def _first_fire(det: TailExcessDetector, bucket: Series, count: Series) -> float | None:
    """The first second (from START) at which `det`, evaluated every second on the histogram as
    Prometheus would hold it by then, fires; None: never."""
    for end in range(2, len(bucket.timestamps) + 1):
        b = Series(bucket.labels, bucket.timestamps[:end], bucket.values[:end])
        c = Series(count.labels, count.timestamps[:end], count.values[:end])
        if det.detect(b, b.timestamps[-1], c).fired:
            return b.timestamps[-1] - START
    return None


@pytest.mark.parametrize("seed", [3, 11])
def test_the_live_detector_decides_as_the_benchmark_core_does_on_a_shared_trace(seed: int):
    """The rig's seeded arrivals (0.5% at 900 ms, 40 req/s): the first second the live detector
    fires, evaluated every second on the cumulative histogram as Prometheus would hold it, is the
    benchmark decider's first alarm on the same per-step counts."""
    steps = seeded_run(seed, Traffic(40.0), Fault(0.005, 900), 240, 500.0)
    above, requests = steps.above[0], steps.requests[0]
    params = TailExcessParams(line=500, evidence="histogram")
    bench = Tailguard.of(params, 1.0, params.lookback_seconds_).start(1)
    bench.feed(steps)
    bucket, count = _histogram(above, requests)
    det = TailExcessDetector(params)
    det.detect(bucket, bucket.timestamps[-1], count)
    assert STORE.wait()
    live = _first_fire(det, bucket, count)
    assert live is not None and bench.first[0] == live


@pytest.mark.slow  # ~2,100 evaluations over up to 2,100 points
def test_at_4_req_s_the_live_detector_decides_over_its_grown_window_as_the_core_does() -> None:
    """0.2% at 600 ms at 4 req/s takes longer than the least lookback (900 s) to show: the core runs
    on, and the live detector, once its window has grown, first fires at the same second (seed 3:
    2123 s; scoring only the least window it fired at 2282 s)."""
    steps = seeded_run(3, Traffic(4.0), Fault(0.002, 600), 3600, 500.0)
    params = TailExcessParams(line=500, evidence="histogram")
    bench = Tailguard.of(params, 1.0, params.max_lookback_seconds).start(1)
    bench.feed(steps)
    bucket, count = _histogram(steps.above[0], steps.requests[0])
    det = TailExcessDetector(params)
    det.detect(bucket, bucket.timestamps[-1], count)
    assert STORE.wait() and det.lookback_seconds == 7200.0
    live = _first_fire(det, bucket, count)
    assert bench.first[0] > 900 and live == bench.first[0], (live, bench.first[0])


def test_two_versions_breaching_at_once_is_a_shared_slowdown_not_a_defect():
    """A canary and its stable serving side by side, both slowed by a shared cause: neither fires and
    both say why; the canary alone breaching still fires."""
    above, requests = _defect()
    v1 = _histogram(above, requests, version="1")
    v2 = _histogram(*_defect(), version="2")
    DET.detect_many([v1[0], v2[0]], v1[0].timestamps[-1], [v1[1], v2[1]])
    assert STORE.wait()
    both = DET.detect_many([v1[0], v2[0]], v1[0].timestamps[-1], [v1[1], v2[1]])
    assert not any(d.fired for d in both)
    assert all(d.reason.startswith("shared slowdown: versions 1, 2") and d.details["shared_slowdown"] == ["1", "2"]
               for d in both)
    quiet = _histogram(np.zeros(300), np.full(300, 40.0), version="1")
    alone = DET.detect_many([quiet[0], v2[0]], v1[0].timestamps[-1], [quiet[1], v2[1]])
    assert [d.fired for d in alone] == [False, True]
