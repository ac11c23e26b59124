"""The poller evaluates many series of one query through the detector's vectorized path, on real
Prometheus data, with the same verdicts as one call per series."""
from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pytest

from core.query import Series
from daemon.sources.prometheus import PrometheusClient
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from detectors._grid import align
from detectors.tail import TailAnomalyDetector, TailAnomalyParams
from lab.prometheus import BackfillSeries, backfill_openmetrics
from tests.support.helpers import NotifySink, local_settings, wait_for

OFFSET = 3600.0
PODS = 10
JUMPING = "p3"
PARAMS = {"min_absolute_increase": 0.1, "baseline_window_seconds": 1200, "evaluation_window_seconds": 120}
POLICY = """
name: ranker-pods
target: {{model: ranker}}
triggers:
  - detector:
      type: tail_anomaly
      query: pod:p999_seconds{{model="$model"}}
      interval: 15s
      params: {params}
actions:
  - type: notify
    url: {url}
"""


def test_align_puts_series_on_one_grid_with_nan_for_missing_points():
    """Missing points become NaN; values land in their own columns."""
    a = Series({"pod": "a"}, (0.0, 15.0, 30.0), (1.0, 2.0, 3.0))
    b = Series({"pod": "b"}, (15.0, 45.0), (5.0, 6.0))
    grid, values = align([a, b])
    assert grid.tolist() == [0.0, 15.0, 30.0, 45.0]
    assert np.array_equal(values, np.array([[1, 2, 3, np.nan], [np.nan, 5, np.nan, 6]]), equal_nan=True)


def _history(now: float, pod: str) -> list[tuple[float, float]]:
    rng = random.Random(pod)
    out, t = [], now - 3600.0
    while t <= now:
        v = 0.2 + rng.gauss(0, 0.005)
        if pod == JUMPING and t > now - 60:
            v = 0.9
        out.append((t, v))
        t += 15.0
    return out


@pytest.mark.integration
async def test_batch_path_on_real_prometheus_flags_only_the_jumping_series(tmp_path: Path, prometheus_factory):
    now0 = time.time() - OFFSET
    data = tmp_path / "tsdb"
    backfill_openmetrics(data, [BackfillSeries("pod:p999_seconds", _history(now0, f"p{i}"),
                                               {"model": "ranker", "pod": f"p{i}"}) for i in range(PODS)])
    prom = await prometheus_factory(scrape_targets={}, data_dir=data)
    async with NotifySink() as sink:
        pol = tmp_path / "policies"
        pol.mkdir()
        (pol / "p.yaml").write_text(POLICY.format(url=sink.url, params=PARAMS))
        settings = local_settings(tmp_path, pol, prometheus={"url": prom.url})
        async with Service(settings, action_registry(), detector_registry(),
                           clock=lambda: time.time() - OFFSET) as svc:
            await wait_for(lambda: len(svc.journal.evaluations.all()) == PODS, timeout=30)
            await wait_for(lambda: len(sink.received) == 1, timeout=15)
            evaluations = await svc.journal.evaluations.all.in_thread()
            # the vectorized path ran: no fallback to per-series was recorded as a fault
            assert svc.metrics.registry.get_sample_value("tailguard_faults_total",
                                                         {"component": "detector"}) is None
    fired = [e.series for e in evaluations if e.fired]
    assert len(fired) == 1 and f'"pod":"{JUMPING}"' in fired[0]
    assert sink.received[0]["signal"]["labels"]["pod"] == JUMPING

    # The same data, one detector call per series, gives the same verdicts.
    client = PrometheusClient(prom.url)
    try:
        result = await client.query_range('pod:p999_seconds{model="ranker"}', now0 - 1320, now0, 15)
    finally:
        client.close()
    detector = TailAnomalyDetector(TailAnomalyParams(**PARAMS))
    single = {s.labels["pod"]: detector.detect(s, now0).fired for s in result.series}
    assert single == {f"p{i}": f"p{i}" == JUMPING for i in range(PODS)}
