"""examples/policies/forecast.yaml and forecast-capacity.yaml: the recommended forecast policies load in
the real loader, read Triton's own summary P99.9 per version, and act as their cases need: a leak of the
served version is rolled back before the crossing (and not scaled), a capacity knee (the forecast
library's, as bench/bench_forecast_policy.py runs it) is scaled out and rolled back never; the old
`bound` fails in one line."""
from __future__ import annotations

import importlib.util
import sys
from typing import Any

import numpy as np
import pytest

from core.query import Series
from daemon.wiring.registries import action_registry, detector_registry
from detectors.forecast import ForecastBreachDetector, ForecastBreachParams
from policies.loader import LoadedPolicy, PolicyLoadError, load_policies_text
from tests.support.paths import REPO

PATH = REPO / "examples" / "policies" / "forecast.yaml"
CAPACITY = REPO / "examples" / "policies" / "forecast-capacity.yaml"
STEP = 15.0


def _load(text: str) -> LoadedPolicy:
    (policy,) = load_policies_text(text, "forecast.yaml", action_registry(), detector_registry()).policies
    return policy


def test_the_forecast_policy_reads_triton_and_states_probability_and_lead() -> None:
    """Triton's summary quantile (not a lab recording rule), in microseconds, with the knobs set."""
    policy = _load(PATH.read_text())
    (bound,) = policy.detectors
    assert "nv_inference_request_summary_us" in bound.trigger.query and 'quantile="0.999"' in bound.trigger.query
    params = bound.params
    assert isinstance(params, ForecastBreachParams)
    assert (params.threshold, params.min_probability, params.min_lead_seconds) == (500000, 0.9, 60)
    assert {a.kind for a in policy.actions} == {"triton.rollback"}
    assert params.cause == "version" and policy.actions[0].params.require_attribution  # type: ignore[attr-defined]
    assert "by (model, version)" in bound.trigger.query
    # The request rate beside it, from Triton's own success counter, for the capacity knee.
    assert bound.trigger.companion_query is not None
    assert "rate(nv_inference_request_success" in bound.trigger.companion_query


def test_a_policy_still_saying_bound_fails_to_load_in_one_line() -> None:
    text = PATH.read_text().replace("min_probability: 0.9 ", "bound: upper ")
    try:
        _load(text)
    except PolicyLoadError as e:
        message = str(e)
    else:
        raise AssertionError("a policy with `bound` loaded")
    assert "\n" not in message and "min_probability" in message and "min_lead_seconds" in message


def test_the_policy_rolls_back_a_leak_before_the_crossing() -> None:
    """Its detector, fed a 12 ms/min leak from 200 ms (10% log-normal noise, in microseconds) one
    cycle at a time, fires while the P99.9 is still under 500 ms, minutes ahead."""
    params = _load(PATH.read_text()).detectors[0].params
    assert isinstance(params, ForecastBreachParams)
    first = _first_fire(ForecastBreachDetector(params.model_dump(exclude_defaults=True)))
    crossing = T0 + FLAT * STEP + 25 * 60.0
    assert first is not None and crossing - first >= 180, (first, crossing)


def test_the_capacity_policy_leaves_a_leak_alone() -> None:
    """The same leak at a steady request rate: the rate does not explain it, so no scale-out."""
    params = _load(CAPACITY.read_text()).detectors[0].params
    assert isinstance(params, ForecastBreachParams)
    assert _first_fire(ForecastBreachDetector(params.model_dump(exclude_defaults=True))) is None


T0, FLAT, LEAK = 1_700_000_000.0, 480, 160  # 2 h quiet, then 40 min of leak
LABELS = {"model": "ranker", "version": "2"}


def _first_fire(det: ForecastBreachDetector) -> float | None:
    """The first time the detector fires on a 12 ms/min leak from 200 ms (10% log-normal noise, in
    microseconds) on version 2, its request rate steady beside it, fed one cycle at a time."""
    rng = np.random.default_rng(7)
    ts = T0 + STEP * np.arange(FLAT + LEAK)
    level = 200.0 + 12.0 * np.maximum(ts - ts[FLAT], 0.0) / 60.0
    vs = 1000.0 * level * np.exp(rng.normal(0, 0.1, ts.size))
    rate = 100.0 * np.exp(rng.normal(0, 0.03, ts.size))
    for i in range(FLAT, ts.size):
        (d,) = det.detect_many([Series(LABELS, ts[: i + 1], vs[: i + 1])], ts[i],
                               [Series(LABELS, ts[: i + 1], rate[: i + 1])])
        if d.fired:
            return float(ts[i])
    return None


@pytest.mark.slow  # two detectors over ~170 cycles of a 3-hour series: ~10 s of CPU
def test_on_the_capacity_knee_nothing_is_rolled_back_and_ranker_is_scaled_out() -> None:
    """The forecast library's knee/00 (bench/bench_forecast_policy.py, one seed): the rollback policy
    never fires (the rate explains the rise), the capacity policy fires minutes before the crossing."""
    bench = _bench()
    (knee,) = [s for s in bench.forecast_library.load(shapes={"knee"}) if s.name == "knee/00"]
    rollback, capacity = bench.policy("forecast.yaml"), bench.policy("forecast-capacity.yaml")
    not_rolled = bench.judge(knee, rollback)
    assert not_rolled.first_fire is None and "capacity knee" in not_rolled.why_not
    scaled = bench.judge(knee, capacity)
    assert scaled.first_fire is not None and scaled.first_fire >= 180, scaled
    assert [a.kind for a in capacity.actions] == ["kubernetes.scale"]


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_forecast_policy", REPO / "bench" / "bench_forecast_policy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_forecast_policy"] = module
    spec.loader.exec_module(module)
    return module
