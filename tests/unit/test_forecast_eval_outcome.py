"""The library's outcome is the event the probability states: the series' own level (the detector's
centered mean of scrapes) at the line, not the generator's noise-free level, which only says when a
rise series crossed."""
from __future__ import annotations

import numpy as np

from detectors.forecast.calibration import centered_level
from evaluation import forecast_library
from evaluation.forecast_eval import LINE_MS, setup_for, stream_library


def test_a_library_streams_truth_is_the_series_own_level_and_its_crossing_the_generators() -> None:
    s = forecast_library.generate("leak_12", 0)
    setup = setup_for("library", forecast_library.STEP_SECONDS)
    st = stream_library(s, setup)
    assert setup.level_points > 1
    np.testing.assert_array_equal(st.truth, centered_level(st.y, setup.level_points)[0])
    assert not np.allclose(st.truth[np.isfinite(st.truth)], s.level[np.isfinite(st.truth)])
    assert st.crossing == int(np.searchsorted(s.timestamps, s.crossing_time))


def test_a_healthy_series_whose_own_level_reaches_the_line_counts_as_reaching_it() -> None:
    # level_shifts moves the noise-free level to at most 450 ms; with its noise the series' own level
    # reaches 500 ms on some seeds: what a forecast of the series should call a crossing.
    setup = setup_for("library", forecast_library.STEP_SECONDS)
    for seed in range(forecast_library.SEEDS):
        s = forecast_library.generate("level_shifts", seed)
        st = stream_library(s, setup)
        if np.nanmax(st.truth) >= LINE_MS:
            assert np.nanmax(s.level) < LINE_MS
            return
    raise AssertionError("no level_shifts seed takes its own level over the line")
