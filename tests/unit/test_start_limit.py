"""The start-test replay of the benchmark (evaluation/operating_curve/start_limit.py) decides what
the live detector decides: on the rig's seeded arrivals with the reference defect from the first
request, the live `detect_many`, called every second, first fires its start test at the second the
replay finds; the deploy-aware limit is quicker without a settle and the replay never before it."""
from __future__ import annotations

import math

import numpy as np

from bench.bench_start_test import DEFECT, LINE_MS, _live_first
from core.query import Series
from detectors.tail_excess import TailExcessDetector, TailExcessParams
from evaluation.operating_curve.arrivals import Steps, seeded_run
from evaluation.operating_curve.start_limit import StartSpec, limit_first, start_first, step_limit_first
from evaluation.operating_curve.traffic import Traffic


def test_the_live_detector_fires_its_start_test_at_the_replays_second() -> None:
    params = TailExcessParams(line=LINE_MS, evidence="histogram")
    spec = StartSpec.of(params)
    for seed in (0, 1):
        steps = seeded_run(seed, Traffic(40.0), DEFECT, 90.0, LINE_MS)
        replay = float(start_first(spec, steps, 1.0)[0])
        assert not math.isnan(replay)
        assert _live_first(params, steps) == replay
        limit = float(limit_first(0.0005, DEFECT.share, spec.alpha, spec.horizon_seconds, steps, 1.0, 40.0)[0])
        assert limit <= replay


def _live_counters_first(params: TailExcessParams, steps: Steps) -> float:
    """Seconds from the first request to the live detector's first start-test alarm on counters (a
    latency counter and a request counter per version; v1 served alone before the deploy)."""
    t0 = 1_000.0
    old_t = np.arange(0.0, t0 + 1)
    old_n = np.cumsum(np.full(old_t.size, 40.0))
    new_t = t0 + np.arange(0, steps.requests.shape[1] + 1, dtype=np.float64)
    count = np.concatenate([[0.0], np.cumsum(steps.requests[0])])
    latency = np.concatenate([[0.0], np.cumsum(steps.latency_ms[0])])
    det = TailExcessDetector(params)
    old = (Series({"version": "1"}, old_t.tolist(), (old_n * 4.0).tolist()), Series({"version": "1"}, old_t.tolist(), old_n.tolist()))
    det.detect_many([old[0]], t0, [old[1]])  # the detector looks before the deploy: v2 is a start
    for k in range(1, new_t.size):
        now = new_t[k]
        out = det.detect_many([old[0], Series({"version": "2"}, new_t[:k + 1].tolist(), latency[:k + 1].tolist())], now,
                              [old[1], Series({"version": "2"}, new_t[:k + 1].tolist(), count[:k + 1].tolist())])
        if any(d.fired and d.reason.startswith("start test:") for d in out):
            return now - t0
    return math.nan


def test_on_counters_the_live_detector_fires_its_start_test_at_the_replays_second() -> None:
    params = TailExcessParams(line=LINE_MS, evidence="counters")
    spec = StartSpec.of(params)
    for seed in (0, 1):
        steps = seeded_run(seed, Traffic(40.0), DEFECT, 120.0, LINE_MS)
        replay = float(start_first(spec, steps, 1.0)[0])
        assert not math.isnan(replay)
        assert _live_counters_first(params, steps) == replay


def test_the_limit_on_steps_keeps_its_rate_and_finds_the_defect() -> None:
    """The SPRT that sees only whether a step holds a slow request: at 0.05 per deploy, healthy runs
    cross about that often (never much more), and the reference defect is found."""
    rng = np.random.default_rng(3)
    runs, cols = 4000, 300
    requests = np.full((runs, cols), 40.0)
    healthy = rng.binomial(40, 0.0005, (runs, cols)).astype(np.float64)
    fired = np.isfinite(step_limit_first(0.0005, 0.005, 0.05, 300.0, Steps(requests, healthy, requests), 1.0, 40.0))
    assert 0.02 < fired.mean() <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs)
    steps = seeded_run(0, Traffic(40.0), DEFECT, 300.0, LINE_MS)
    assert math.isfinite(float(step_limit_first(0.0005, DEFECT.share, 0.001, 900.0, steps, 1.0, 40.0)[0]))
