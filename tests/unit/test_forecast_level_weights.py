"""Level weights (localized conformal): a past error path counts by how near the series' level at
its origin was to now's, so a series that turned back at this level before is less likely to be
read as crossing the line above it."""
from __future__ import annotations

import numpy as np

from detectors.forecast.calibration import LEVEL_FLOOR, PathForecast, level_weights
from detectors.forecast.holt_paths import holt_batch, holt_fit_params, holt_paths

H, POINTS = 10, 1


def test_paths_from_origins_at_nows_level_weigh_most_and_far_ones_little() -> None:
    rng = np.random.default_rng(0)
    y = np.concatenate([np.full(150, 200.0), np.full(150, 400.0), np.full(60, 200.0)]) * rng.lognormal(0, 0.01, 360)
    k = 360 - 1 - H - POINTS // 2 - 20 + 1
    w = level_weights(y, k, H, POINTS)
    origins = np.arange(360 - 1 - H - k + 1, 360 - H)
    near = (origins < 150) | (origins >= 300)
    assert w.shape == (k,)
    assert w[near].min() > 0.5  # within a bandwidth of now's level
    assert LEVEL_FLOOR <= w[~near].min() and w[~near].max() < 0.1  # twice as high: little past the floor


def test_a_batch_reads_each_row_as_alone_and_a_row_without_a_level_keeps_the_floor() -> None:
    rng = np.random.default_rng(1)
    rows = 200.0 + np.cumsum(rng.normal(0, 3, (4, 240)), axis=1)
    rows[2] = np.nan
    rows[3, :50] = np.nan  # a shorter history, left-padded
    k = 150
    batch = level_weights(rows, k, H, 5)
    for i in range(4):
        np.testing.assert_array_equal(batch[i], level_weights(rows[i], k, H, 5))
    np.testing.assert_array_equal(batch[2], np.full(k, LEVEL_FLOOR))
    assert np.isfinite(batch).all() and (batch >= LEVEL_FLOOR).all()
    assert level_weights(rows[0, :15], 30, H, 5).shape == (30,)  # no origin known yet: equal weights


def _holt_probability(window: np.ndarray, line: float, local: bool) -> float:
    params = holt_fit_params(window[None], 30.0)
    point, errors = holt_paths(holt_batch(window[None], 30.0, params), window[None], H, POINTS, True)
    weights = level_weights(window, errors.shape[1], H, POINTS) if local else None
    f = PathForecast.from_errors(0.0, 30.0, point[0], errors[0], True, 1e9, {}, weights)
    return f.first_passage(line, "above", H).probability


def test_a_series_that_turned_back_at_this_level_before_is_read_as_less_likely_to_cross() -> None:
    # A sawtooth: 200 up to 450 ms over 60 scrapes, then back to 200; the line just above its top.
    rng = np.random.default_rng(3)
    t = np.arange(600)
    y = (200.0 + 250.0 * (t % 60) / 59) * rng.lognormal(0, 0.02, t.size)
    for end in (410, 412, 414, 416):  # rising, 25-35 ms under the top, 6 steps before it turns
        window = y[end - 359 : end + 1]
        assert y[end + 1 : end + 1 + H].max() < 460.0  # what then happened: it turned back
        plain, local = _holt_probability(window, 460.0, False), _holt_probability(window, 460.0, True)
        assert local < plain - 0.05, (end, plain, local)


def test_the_bit_packed_sort_orders_like_argsort_and_falls_back_where_it_could_not() -> None:
    from detectors.forecast.calibration import ascending

    rng = np.random.default_rng(4)
    cases = {
        "latencies": rng.lognormal(5.5, 0.3, (3, 7, 301)),
        "ties": np.round(rng.lognormal(5.5, 0.3, (3, 7, 301)), 1),
        "apart in the lowest bits": np.nextafter(np.full((2, 64), 300.0), np.inf) * (1 + 1e-15 * rng.random((2, 64))),
        "signed": rng.normal(0.0, 1.0, (4, 50)),
        "with NaN": np.where(rng.random((4, 50)) < 0.1, np.nan, rng.lognormal(5.5, 0.3, (4, 50))),
    }
    for name, values in cases.items():
        order, ranked = ascending(values)
        want = np.sort(values, axis=-1)
        np.testing.assert_array_equal(ranked, want, err_msg=name)
        np.testing.assert_array_equal(np.take_along_axis(values, order, axis=-1), want, err_msg=name)
        assert (np.sort(order, axis=-1) == np.arange(values.shape[-1])).all(), name  # a permutation
