"""The Holt cycle's batched outlook (`prepare` reads every series' probability, crossing and band
at once) gives the Detections the one-series path in `detect` gives, field for field; its parts
agree with the one-series functions they replace."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from core.query import Series
from detectors.forecast import ForecastBreachDetector, PathForecast, first_passage_batch
from detectors.forecast.calibration import first_passage_paths, recency_weights
from detectors.forecast.outlook import forecast_rows, outlook_batch, outlook_of

T0 = 1_700_000_000.0
STEP = 15.0


async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def varied_batch(seed: int, n: int = 24) -> list[Series]:
    """Leaks, flat noise, level shifts, bursts, gaps and shorter histories, ending together."""
    rng = np.random.default_rng(seed)
    points = 1440
    ts = T0 + STEP * np.arange(points)
    t = np.arange(points, dtype=float)
    out = []
    for i in range(n):
        vs = 200.0 + rng.normal(0, rng.uniform(2, 20), points)
        kind = i % 6
        if kind == 0:  # a leak, short of the line so far
            start = points - int(rng.integers(30, 200))
            vs[start:] += rng.uniform(100, 280) * (t[start:] - start) / (points - start)
        elif kind == 1:
            vs[points - int(rng.integers(5, 60)) :] += rng.uniform(50, 200)
        elif kind == 2:
            at = points - int(rng.integers(10, 100))
            vs[at : at + 8] += 250.0
        elif kind == 3:  # missed scrapes, some runs long enough to break the history
            keep = rng.random(points) > 0.1
            keep[points - 500 : points - 500 + int(rng.integers(5, 60))] = False
            out.append(Series({"pod": str(i)}, ts[keep], vs[keep]))
            continue
        elif kind == 4:  # a shorter history
            m = int(rng.integers(100, 400))
            out.append(Series({"pod": str(i)}, ts[-m:], vs[-m:] * rng.lognormal(0, 0.05, m)))
            continue
        out.append(Series({"pod": str(i)}, ts, vs))
    return out


def plain(d: Any) -> Any:
    return dataclasses.asdict(d)


@pytest.mark.parametrize("config", [
    {"threshold": 500},
    {"threshold": 400, "errors": "absolute", "min_probability": 0.3, "min_lead_seconds": 0},
    {"threshold": 150, "direction": "below", "level_window_seconds": 0},
])
@pytest.mark.parametrize("seed", [0, 1])
def test_prepared_outlooks_equal_the_one_series_path(config: dict[str, Any], seed: int) -> None:
    batch = varied_batch(seed)
    now = T0 + STEP * 1439
    # Same parameters on both sides: fit them once per series, then filter either way.
    batched, alone = ForecastBreachDetector(config), ForecastBreachDetector(config)
    for s in batch:
        batched.detect(s, now - STEP)
        alone.detect(s, now - STEP)
    asyncio.run(batched.prepare(batch, now, inline))
    assert len(batched._forecaster._prepared) >= 16  # type: ignore[attr-defined]  # the batched path ran
    got = [plain(batched.detect(s, now)) for s in batch]
    want = [plain(alone.detect(s, now)) for s in batch]
    assert got == want
    assert any(d["details"].get("forecast") for d in want)  # the band was compared, not skipped


@pytest.mark.parametrize("k", [30, 31, 137, 275, 280, 300, 301])
@pytest.mark.parametrize("half_life", [1e9, 50.0])
def test_batched_band_and_passage_equal_the_one_series_functions(k: int, half_life: float) -> None:
    rng = np.random.default_rng(k)
    b, h = 5, 17
    point = 100.0 + np.cumsum(rng.normal(1, 1, (b, h)), axis=1)
    errors = rng.normal(0, 0.05, (b, k, h))
    errors[:, : k // 3] = np.round(errors[:, : k // 3], 2)  # ties
    errors[1, 3, 5] = np.inf  # a row that drops a path: the one-series path
    starts, steps = T0 + rng.uniform(0, 60, b), np.full(b, STEP)
    infos = [{"row": i} for i in range(b)]
    local = rng.uniform(0.02, 1.0, (b, k))  # each row's own level weights
    local[3] = 1.0  # and a row whose paths all count alike
    got = outlook_batch(starts, steps, point, errors, True, half_life, 110.0, "above", infos, local)
    for i in range(b):
        f = PathForecast.from_errors(float(starts[i]), STEP, point[i], errors[i], True, half_life, infos[i], local[i])
        want = outlook_of(f, 110.0, "above")
        assert got[i].rows == want.rows and (want.passage is None or want.rows == forecast_rows(f))
        np.testing.assert_array_equal(got[i].point, want.point)
        assert got[i].passage == want.passage and got[i].paths == want.paths and got[i].info == want.info
    w = recency_weights(k, half_life)
    paths = point[:, None, :] + errors * np.abs(point[:, :1])[:, :, None]
    for direction in ("above", "below"):
        fast = first_passage_paths(paths, 110.0, direction, w)
        slow = first_passage_batch(point, errors * np.abs(point[:, :1])[:, :, None], False, 110.0, direction, h, w)
        for x, y in zip(fast, slow):
            np.testing.assert_array_equal(x, y)
