"""The ramp picture's forecast band comes from the acting signal's journaled details."""
from __future__ import annotations

from lab.scenarios.ramp import forecast_series


def test_the_band_is_read_in_ms_from_the_summarys_microseconds_and_named_with_the_probability() -> None:
    details = {"probability": 0.929, "forecast_columns": ["time", "point", "p10", "p50", "p90"],
               "forecast": [[100.0, 350e3, 330e3, 350e3, 370e3], [130.0, 430e3, 400e3, 430e3, 450e3]]}
    band = {s.name: s for s in forecast_series(details)}
    p50 = next(s for name, s in band.items() if "p50" in name)
    assert "P=0.93" in p50.name and list(p50.times) == [100.0, 130.0]
    assert [round(v) for v in p50.values] == [350, 430]
    assert [round(v) for v in band["forecast band p90"].values] == [370, 450]


def test_the_band_stops_soon_after_the_predicted_crossing() -> None:
    details = {"probability": 0.95, "predicted_crossing_time": 130.0,
               "forecast_columns": ["time", "point", "p10", "p50", "p90"],
               "forecast": [[t, 0.4, 0.3, 0.4, 0.5] for t in (100.0, 130.0, 250.0, 251.0, 700.0)]}
    assert [list(s.times) for s in forecast_series(details)][0] == [100.0, 130.0, 250.0]


def test_no_forecast_no_band() -> None:
    assert forecast_series({}) == []
    assert forecast_series({"forecast": [[1.0, 2.0]], "forecast_columns": ["time", "point"]}) == []
