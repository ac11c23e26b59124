"""The evidence gate on an alert trigger: the policy names a detector that can feed it, and the
verdict vetoes only when every version is shown within budget on fresh evidence."""
from __future__ import annotations

import pytest

from core.detection import BudgetEvidence
from daemon.wiring.registries import action_registry, detector_registry
from policies.gate import gate_verdict
from policies.loader import GATE_NEEDS, PolicyLoadError, load_policies_text

NULL, ALT = 0.0005, 0.002
POLICY = """
name: p
target: {{model: ranker, triton: {{endpoints: ["http://127.0.0.1:9"]}}}}
triggers:
{detectors}  - alert: {{name: TritonTailLatencyHigh, gate: {gate}}}
actions:
  - {{type: triton.rollback, to: previous}}
verify: {{query: up, below: 1}}
"""
TAIL = """  - detector: {type: tail_excess, query: lat, companionQuery: req, params: {line: 500000}}
"""
VALUE = """  - detector: {type: value_cusum, query: p999}
"""


def _load(detectors: str, gate: str = "{error: 0.01}"):
    return load_policies_text(POLICY.format(detectors=detectors, gate=gate), "p.yaml", action_registry(),
                              detector_registry())


def test_a_gate_is_fed_by_the_policy_s_one_tail_excess_trigger():
    (policy,) = _load(TAIL + VALUE).policies
    bound = policy.gate_for(2)
    assert bound is not None and bound.index == 0
    (explicit,) = _load(VALUE + TAIL, "{detector: 1}").policies
    assert explicit.gate_for(2).index == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("detectors, gate", [("", "{}"), (VALUE, "{}"), (TAIL + VALUE, "{detector: 1}"),
                                             (TAIL + TAIL, "{}")])
def test_a_gate_nothing_can_feed_fails_to_load_in_one_line(detectors: str, gate: str):
    with pytest.raises(PolicyLoadError) as caught:
        _load(detectors, gate)
    assert GATE_NEEDS in str(caught.value) and "alert.gate" in str(caught.value)


def _budget(above: float, requests: float) -> BudgetEvidence:
    return BudgetEvidence(above, requests, NULL, ALT)


def test_every_version_within_budget_vetoes_and_says_so():
    verdicts = [({"version": "1"}, _budget(0, 40_000)), ({"version": "2"}, _budget(1, 36_000))]
    v = gate_verdict(verdicts, at=100.0, stale_after=30.0, now=101.0, error=0.01)
    assert v.veto and "1: within budget" in v.reason and "2: within budget" in v.reason


def test_one_version_not_shown_within_budget_lets_the_alert_act():
    # A new version 2 minutes old at 0.2%: too little evidence to accept the null: the backstop acts.
    verdicts = [({"version": "1"}, _budget(0, 40_000)), ({"version": "2"}, _budget(10, 4_800))]
    v = gate_verdict(verdicts, at=100.0, stale_after=30.0, now=101.0, error=0.01)
    assert not v.veto and "2: not shown within budget" in v.reason


@pytest.mark.parametrize("verdicts, at, now, why", [
    (None, None, 10.0, "not evaluated"),
    ([({"version": "2"}, _budget(0, 40_000))], 100.0, 131.0, "older than its 30 s horizon"),
    ([], 100.0, 101.0, "no series"),
])
def test_no_fresh_evidence_lets_the_alert_act(verdicts, at, now, why):
    v = gate_verdict(verdicts, at=at, stale_after=30.0, now=now, error=0.01)
    assert not v.veto and why in v.reason


def test_evidence_a_few_slow_cycles_old_is_still_weighed():
    """A loaded node runs a 1 s detector's cycles late (4 s on two cores with three labs): its
    evidence, minutes of lookback, still says what the versions are; only the detector's own
    horizon (the age of data it still judges on) makes it stale."""
    slow = [({"version": v}, BudgetEvidence(above, requests, NULL, ALT, allowed=0.001))
            for v, above, requests in (("1", 500, 40_000), ("2", 60, 4_000))]
    late = gate_verdict(slow, at=100.0, stale_after=30.0, now=104.0, error=0.01)
    assert late.veto and "shared slowdown" in late.reason
    gone = gate_verdict(slow, at=100.0, stale_after=30.0, now=131.0, error=0.01)
    assert not gone.veto and "31 s old" in gone.reason


def test_the_error_bounds_a_wrong_veto():
    """At the alternative (2x budget), acceptance happens at most `error` of the time: simulated."""
    import numpy as np
    rng = np.random.default_rng(1)
    requests = 36_000
    vetoes = sum(gate_verdict([({"version": "2"}, _budget(float(k), requests))], 1.0, 1.0, 1.0, 0.01).veto
                 for k in rng.poisson(ALT * requests, 20_000))
    assert vetoes / 20_000 <= 0.01
