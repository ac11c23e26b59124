"""The start-test replay of the benchmark (evaluation/operating_curve/start_limit.py) decides what
the live detector decides: on the rig's seeded arrivals with the reference defect from the first
request, the live `detect_many`, called every second, first fires its start test at the second the
replay finds; the deploy-aware limit is quicker without a settle and the replay never before it."""
from __future__ import annotations

import math

from bench.bench_start_test import DEFECT, LINE_MS, _live_first
from detectors.tail_excess import TailExcessParams
from evaluation.operating_curve.arrivals import seeded_run
from evaluation.operating_curve.start_limit import StartSpec, limit_first, start_first
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
