"""The Holt cycle's shortcuts give what the plain functions give, exactly: a history read on a
shared `Timeline` equals `read_history` and `window_of` of that series alone; the reused work
arrays change no outlook."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from core.query import Series
from detectors.forecast.arrays import read_history, window_of
from detectors.forecast.calibration import error_paths, first_passage_batch, first_passage_paths, recency_weights
from detectors.forecast.history_memo import CycleHistories
from detectors.forecast.outlook import outlook_batch
from detectors.forecast.params import ForecastBreachParams
from detectors.forecast.scratch import Scratch

T0 = 1_700_000_000.0


def shared_series(seed: int, step: float) -> tuple[list[Series], float]:
    """Series on one timestamps object (jittered, ms-rounded, sometimes a list): clean values,
    NaN and inf values (they drop points: read alone), a wrong length, constant values."""
    rng = np.random.default_rng(seed)
    n = int(6 * 3600 / step) + 30
    ts = np.round(T0 + step * np.arange(n) + rng.uniform(-0.004, 0.004, n), 3)
    ts[rng.integers(0, n, 3)] = np.nan  # a bad timestamp drops that point for every series
    shared: Any = ts.tolist() if seed % 2 else ts
    out = []
    for i in range(12):
        vs = 200.0 + np.cumsum(rng.normal(0, 1, n))
        if i == 1:
            vs[rng.random(n) < 0.05] = np.nan
        elif i == 2:
            vs[int(rng.integers(0, n))] = np.inf
        elif i == 3:
            vs = vs[:-1]
        elif i == 4:
            vs[:] = 7.0
        out.append(Series({"i": str(i)}, shared, vs.tolist() if seed % 2 else vs))
    return out, float(np.nanmax(ts)) - 2 * step


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("step", [5.0, 15.0, 30.0])
@pytest.mark.parametrize("config", [{}, {"step_seconds": 15.0, "max_gap_seconds": 40.0}, {"lookback_seconds": "1h"}])
def test_histories_on_a_shared_timeline_equal_reading_each_alone(seed: int, step: float,
                                                                  config: dict[str, Any]) -> None:
    params = ForecastBreachParams.model_validate({"threshold": 500, **config})
    batch, now = shared_series(seed, step)
    memo = CycleHistories(params)
    for s in batch:
        try:
            want = read_history(s, now, params)
        except ValueError as exc:
            with pytest.raises(ValueError, match=str(exc)):
                memo.read(s, now)
            continue
        got = memo.read(s, now)
        np.testing.assert_array_equal(got.timestamps, want.timestamps)
        np.testing.assert_array_equal(got.values, want.values)
        assert (got.step, got.max_gap, got.max_staleness) == (want.step, want.max_gap, want.max_staleness)
        for points in (60, 360, 100_000):
            for x, y in zip(memo.window(got, points), window_of(want, points)):
                np.testing.assert_array_equal(x, y)


def test_first_passage_with_non_finite_paths_and_scratch() -> None:
    rng = np.random.default_rng(5)
    point = 100.0 + np.cumsum(rng.normal(1, 1, (6, 30)), axis=1)
    errors = rng.normal(0, 5, (6, 40, 30))
    errors[2, 4, 7], errors[3, :, 0] = np.nan, np.inf
    w = recency_weights(40, 50.0)
    scratch = Scratch()
    for direction in ("above", "below"):
        want = first_passage_batch(point, errors, False, 110.0, direction, 30, w)
        for s in (None, scratch):
            got = first_passage_paths(point[:, None, :] + errors, 110.0, direction, w, s)
            for x, y in zip(got, want):
                np.testing.assert_array_equal(x, y)


def test_error_paths_into_the_backcasts_equal_a_fresh_array() -> None:
    rng = np.random.default_rng(7)
    values = 100.0 + np.cumsum(rng.normal(0, 1, (3, 200)), axis=1)
    back = 100.0 + rng.normal(0, 1, (3, 150, 20))
    for relative in (False, True):
        want = error_paths(values, back, 20, 5, relative)
        mine = back.copy()
        got = error_paths(values, mine, 20, 5, relative, out=mine)
        np.testing.assert_array_equal(got, want)


def test_outlooks_with_reused_scratch_equal_fresh_ones() -> None:
    rng = np.random.default_rng(11)
    scratch = Scratch()
    for b, k, h in [(8, 275, 60), (3, 40, 12), (8, 275, 60), (5, 100, 61)]:  # shapes shrink and grow
        point = 100.0 + np.cumsum(rng.normal(1, 1, (b, h)), axis=1)
        errors = rng.normal(0, 0.05, (b, k, h))
        errors[0, 1, 2] = np.nan
        kept = errors.copy()
        starts, steps = T0 + rng.uniform(0, 60, b), np.full(b, 15.0)
        infos = [{"row": i} for i in range(b)]
        local = rng.uniform(0.02, 1.0, (b, k))
        for relative in (True, False):
            want = outlook_batch(starts, steps, point, errors, relative, 1e9, 110.0, "above", infos, local)
            got = outlook_batch(starts, steps, point, errors, relative, 1e9, 110.0, "above", infos, local, scratch)
            np.testing.assert_array_equal(errors, kept)  # the errors are left as they are
            for g, w in zip(got, want):
                assert (g.rows, g.passage, g.paths, g.info) == (w.rows, w.passage, w.paths, w.info)
