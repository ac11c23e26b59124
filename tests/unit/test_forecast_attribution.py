"""detectors/forecast/attribution.py: a forecast rise is the load's when the request rate explains it
(the knee), the served version's only when the previous version does not show it; `cause` keeps the
firings of one kind and says why the others were not acted on."""
from __future__ import annotations

from typing import Any

import pytest

from core.detection import Detection
from detectors.forecast.attribution import attribute, previous_row
from detectors.forecast.params import ForecastBreachParams


def det(fired: bool, value: float = 300.0, knee: bool = False) -> Detection:
    details: dict[str, Any] = {"knee": {"used": knee, "capacity_rate": 120.0, "slope_t": 9.0}} if knee else {}
    return Detection(detector="forecast_breach", fired=fired, value=value, threshold=500.0, reason="P=0.95",
                     episode_start=1.0 if fired else None, details=details)


V1, V2, V10 = ({"model": "m", "version": v} for v in ("1", "2", "10"))


def test_the_previous_version_is_the_highest_below_by_number() -> None:
    labels = [V10, V1, V2]
    assert previous_row(labels, 0, "version") == 2 and previous_row(labels, 1, "version") is None


def test_a_rise_on_the_new_version_alone_is_attributed() -> None:
    (old, new) = attribute([det(False), det(True)], [V1, V2], "version")
    assert new.fired and new.details["attribution"]["attributed"] and new.details["attribution"]["previous"] == "1"
    assert not old.fired


@pytest.mark.parametrize("previous", [det(True), det(False, value=600.0)])
def test_a_rise_the_previous_version_shows_too_is_not_the_versions(previous: Detection) -> None:
    (_, new) = attribute([previous, det(True)], [V1, V2], "version")
    assert not new.fired and "previous version 1 shows it too" in new.reason and new.episode_start is None


def test_a_knee_fires_for_load_and_not_for_version() -> None:
    (as_version,) = attribute([det(True, knee=True)], [V2], "version")
    assert not as_version.fired and "capacity knee" in as_version.reason
    (as_load,) = attribute([det(True, knee=True)], [V2], "load")
    assert as_load.fired and as_load.details["attribution"]["cause"] == "load"
    (leak_as_load,) = attribute([det(True)], [V2], "load")
    assert not leak_as_load.fired


def test_no_version_label_is_not_attributed_and_any_changes_nothing() -> None:
    (unlabelled,) = attribute([det(True)], [{"model": "m"}], "version")
    assert not unlabelled.fired and "no 'version' label" in unlabelled.reason
    found = [det(True, knee=True), det(True)]
    assert attribute(found, [V1, V2], "any") == found


def test_cause_load_needs_the_request_rate() -> None:
    params = ForecastBreachParams(threshold=500.0, cause="load")
    assert "companionQuery" in (params.query_problem("q", None) or "")
    assert params.query_problem("q", "rate") is None
