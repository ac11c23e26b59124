"""`align` copying whole rows where a series is the grid gives what placing every point gives."""
from __future__ import annotations

import re

import numpy as np
import pytest

from core.query import Series
from detectors._grid import align, align_pointwise


def _random_series(rng: np.random.Generator, n: int, points: int, step: float, share: bool) -> list[Series]:
    """Series of one range query: most complete, some with scrape gaps, a few starting late or
    ending early, one off the grid, one with a repeated timestamp. `share`: complete series share
    one timestamps tuple, as the range cache hands them out."""
    grid = 1_767_225_600.0 + step * np.arange(points)
    whole = tuple(float(t) for t in grid)
    out = []
    for i in range(n):
        ts = grid.copy()
        kind = rng.random()
        if kind < 0.15:
            ts = ts[rng.random(points) > 0.2]  # gaps
        elif kind < 0.2:
            ts = ts[int(rng.integers(1, points)):]  # a new series
        elif kind < 0.25:
            ts = ts[:int(rng.integers(1, points))]  # a series that went away
        values = rng.normal(100.0, 10.0, ts.size)
        values[rng.random(ts.size) < 0.05] = np.nan  # NaN values are points, kept
        stamps = whole if share and ts.size == points else tuple(float(t) for t in ts)
        out.append(Series({"i": str(i)}, stamps, tuple(float(v) for v in values)))
    out.append(Series({"i": "off"}, (grid[0] + step / 2, grid[3] + 0.001), (1.0, 2.0)))
    out.append(Series({"i": "repeat"}, (grid[0], grid[0], grid[1]), (1.0, 2.0, 3.0)))
    return out


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_fast_path_equals_pointwise_on_random_series_with_gaps(seed: int, share: bool) -> None:
    """Same grid and the same [S x P] values (NaN where the same) on random series with gaps,
    late starts, early ends, off-grid points and a repeated timestamp, in random order, with
    timestamps tuples of their own or shared."""
    rng = np.random.default_rng(seed)
    series = _random_series(rng, 200, int(rng.integers(2, 130)), 5.0, share)
    order = rng.permutation(len(series))
    series = [series[i] for i in order]
    grid, values = align(series)
    want_grid, want_values = align_pointwise(series)
    np.testing.assert_array_equal(grid, want_grid)
    np.testing.assert_array_equal(values, want_values)  # NaN == NaN for this assertion


def test_all_complete_and_empty_inputs_match() -> None:
    """A query where every series is the grid, one where none has a point, and no series."""
    ts = (10.0, 15.0, 20.0)
    full = [Series({"i": str(i)}, ts, (float(i), i + 0.5, float("nan"))) for i in range(5)]
    for series in (full, [Series({}, (), ())], []):
        grid, values = align(series)
        want_grid, want_values = align_pointwise(series)
        np.testing.assert_array_equal(grid, want_grid)
        np.testing.assert_array_equal(values, want_values)
        assert values.shape == want_values.shape


def test_malformed_series_still_raises() -> None:
    """A series with more values than timestamps, or fewer, raises the ValueError the per-series
    paths turn into a reason, on the fast path as on the pointwise one."""
    ok = Series({"i": "0"}, (1.0, 2.0), (1.0, 2.0))
    for bad in (Series({"i": "1"}, (1.0, 2.0), (1.0, 2.0, 3.0)), Series({"i": "1"}, (1.0, 2.0), (1.0,))):
        with pytest.raises(ValueError, match="different lengths"):
            align_pointwise([ok, bad])
        with pytest.raises(ValueError, match="different lengths"):
            align([ok, bad])


@pytest.mark.parametrize("odd", [("1.5", "2"), (None, 2.0), (1, True), ("x", 2.0), (1.0, [2.0]), (float("inf"), -0.0)])
def test_whole_grid_rows_converted_as_a_block_convert_as_one_by_one(odd: tuple[object, ...]) -> None:
    """Rows that are the whole grid go through numpy as one block: values numpy converts (numeric
    text, None as NaN, ints, bools) come out the same, and what it cannot convert raises what
    the row by row conversion raises, at the same row, also among gap rows and good rows."""
    ts = (10.0, 15.0)
    good = Series({"i": "0"}, ts, (1.0, 2.0))
    gap = Series({"i": "1"}, (15.0,), (7.0,))
    for series in ([good, Series({"i": "odd"}, ts, odd)], [gap, Series({"i": "odd"}, ts, odd), good]):
        try:
            want = align_pointwise(series)
        except Exception as exc:  # noqa: BLE001 - whatever it is, the fast path must raise it too
            with pytest.raises(type(exc), match=re.escape(str(exc))):
                align(series)
            continue
        got = align(series)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
