"""examples/policies/forecast.yaml: the recommended forecast policy loads in the real loader, reads
Triton's own summary P99.9, acts on a leak before the crossing, and the old `bound` fails in one line."""
from __future__ import annotations

import numpy as np

from core.query import Series
from daemon.wiring.registries import action_registry, detector_registry
from detectors.forecast import ForecastBreachDetector, ForecastBreachParams
from policies.loader import LoadedPolicy, PolicyLoadError, load_policies_text
from tests.support.paths import REPO

PATH = REPO / "examples" / "policies" / "forecast.yaml"
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
    det = ForecastBreachDetector(params.model_dump(exclude_defaults=True))
    rng = np.random.default_rng(7)
    flat, leak = 480, 160  # 2 h quiet, then 40 min of leak
    ts = 1_700_000_000.0 + STEP * np.arange(flat + leak)
    level = 200.0 + 12.0 * np.maximum(ts - ts[flat], 0.0) / 60.0
    vs = 1000.0 * level * np.exp(rng.normal(0, 0.1, ts.size))
    crossing = ts[flat] + 25 * 60.0
    first = None
    for i in range(flat, ts.size):
        d = det.detect(Series({"model": "ranker"}, ts[: i + 1], vs[: i + 1]), ts[i])
        if d.fired:
            first = ts[i]
            break
    assert first is not None and crossing - first >= 180, (first, crossing)
