"""The Prometheus client against a real Prometheus: range queries at any step the callers derive
(a backtest's `(end - start) / 20000`, a quarter of a scrape interval) are answered."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from daemon.sources.prometheus import PrometheusClient
from lab.prometheus import BackfillSeries, backfill_openmetrics

pytestmark = pytest.mark.integration


async def test_a_fractional_step_is_answered(tmp_path: Path, prometheus_factory: Any) -> None:
    end = time.time() - 3600.0  # promtool writes past blocks
    samples = [(end - 300.0 + 5.0 * k, float(k)) for k in range(61)]
    data = tmp_path / "tsdb"
    backfill_openmetrics(data, [BackfillSeries("probe_total", samples, {"job": "probe"})])
    prom = await prometheus_factory(scrape_targets={}, data_dir=data)
    client = PrometheusClient(prom.url)
    try:
        found = await client.query_range("probe_total", end - 30.0, end, 1.5)
    finally:
        client.close()
    assert found.error is None, found.error
    (series,) = found.series
    assert len(series.timestamps) == 21 and series.timestamps[1] - series.timestamps[0] == pytest.approx(1.5)
