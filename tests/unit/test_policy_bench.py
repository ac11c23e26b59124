"""The policy benchmark's pure parts (evaluation/operating_curve/policy_*.py, deploy_limit.py) and
its screen: polling the live detector only where Page's statistic nears the threshold finds the
rollback polling every cycle finds."""
from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.operating_curve.arrivals import Fault
from evaluation.operating_curve.deploy_limit import cusum_first, sprt_first
from evaluation.operating_curve.policies import Setup, candidates, run_rows, screen_levels, simulate
from evaluation.operating_curve.policy_alerts import AlertModel, notifications, run_lengths
from evaluation.operating_curve.policy_live import LiveRow, Row, alert_acts, start_fire
from evaluation.operating_curve.policy_models import PolicyModel, example_models
from evaluation.operating_curve.traffic import Traffic
from detectors.sequential.thresholds import Promise


@pytest.fixture(scope="module")
def models() -> dict[str, PolicyModel]:
    return {m.file: m for m in example_models()}


def test_examples_modelled_or_said_why(models: dict[str, PolicyModel]) -> None:
    assert models["ranker.yaml"].skipped is None and models["ranker.yaml"].alerts == (1,)
    assert models["ranker.yaml"].params.evidence == "counters" and models["ranker.yaml"].interval == 1.0
    assert models["ranker-istio.yaml"].interval == 5.0 and models["ranker-istio.yaml"].version_label == "destination_version"
    assert "no rollback-class action" in (models["retune.yaml"].skipped or "")
    assert "bench_canary" in (models["canary.yaml"].skipped or "")


def test_run_lengths() -> None:
    true = np.array([[True, True, False, True, True, True]])
    assert run_lengths(true).tolist() == [[1, 2, 0, 1, 2, 3]]


def test_exact_alert_fires_after_for_and_group_wait() -> None:
    # 40 req/s, three slow requests at 100 s: above 0.1% of the 60 s window (2400) until 160 s.
    req = np.full((1, 400), 40.0)
    slow = np.zeros((1, 400))
    slow[0, 100] = 3
    exact = notifications(AlertModel("exact"), slow, req, t0=0.0)[0]
    # True at the evaluations after 105, 110, ... 160 s: firing at 135 (for: 30s), webhook 5 s later.
    assert exact.tolist() == [140.0]
    assert notifications(AlertModel("summary"), slow, req, t0=0.0)[0].size == 0  # under 5 slow: unmoved
    slow[0, 101] = 2
    assert notifications(AlertModel("summary"), slow, req, t0=0.0)[0].tolist() == [140.0]


def test_short_episode_never_fires() -> None:
    req = np.full((1, 400), 4.0)
    slow = np.zeros((1, 400))
    slow[0, 100] = 1  # in the window for 60 s: 12 evaluations, enough for for: 30s
    assert notifications(AlertModel("exact", for_seconds=60.0), slow, req, t0=0.0)[0].size == 0
    assert notifications(AlertModel("exact", for_seconds=30.0), slow, req, t0=0.0)[0].size == 1


def test_sprt_and_cusum_first() -> None:
    slow = np.zeros((2, 100))
    slow[0, 9] = 30  # one row with a burst at 10 s
    req = np.full((2, 100), 40.0)
    first = sprt_first(slow, req, 0.0005, 0.005, 0.001)
    assert first[0] == 10.0 and math.isinf(first[1])
    promise = Promise(30.0, 1.0)
    assert cusum_first(slow, req, 0.0005, 0.005, promise, 40.0)[0] == 10.0
    assert math.isinf(cusum_first(slow, req, 0.0005, 0.005, promise, 40.0, after=20)[0])


def test_series_split_at_the_deploy(models: dict[str, PolicyModel]) -> None:
    model = models["ranker-histogram.yaml"]
    row = Row(10, np.full(30, 4.0), np.zeros(30), None)
    primaries, companions = LiveRow(model, row, -math.inf).series(now=5.0, span=100.0)
    v1, v2 = companions
    assert v1.labels["version"] == "1" and v2.labels["version"] == "2"
    assert v1.timestamps[-1] == v2.timestamps[0]  # v1 until the deploy, v2 from it
    assert v2.values[0] == 0.0 and v2.values[-1] == 20.0  # 5 s at 4 req/s since the deploy
    assert primaries[0].labels["le"] == "500"


def test_start_test_fires_on_a_defect_from_the_deploy(models: dict[str, PolicyModel]) -> None:
    model = models["ranker-histogram.yaml"]
    rows = simulate(Traffic(40.0), Fault(0.005, 900), 1, 400, np.random.default_rng(3), False,
                    before=Fault(0.0005, 900))
    fired, starts = start_fire(model, rows[0])
    assert "2" in starts and 5.0 < fired < 200.0


def _gated(model: PolicyModel) -> PolicyModel:
    """ranker.yaml with its alert gated by the detector's evidence, as it was before the governed rule."""
    from daemon.wiring.registries import action_registry, detector_registry
    from evaluation.operating_curve.policy_models import EXAMPLES, model_of
    from policies.loader import load_policies_text

    text = (EXAMPLES / "ranker.yaml").read_text()
    assert "backstopAfter: 5m" in text
    text = text.replace("backstopAfter: 5m", "backstopAfter: 5m\n      gate: {error: 0.01}")
    return model_of(load_policies_text(text, "gated", action_registry(), detector_registry()).policies[0], "gated")


def test_governed_alert_notifies_while_the_detector_sees(models: dict[str, PolicyModel]) -> None:
    model = models["ranker.yaml"]
    rows = simulate(Traffic(4.0), Fault(0.0005, 900), 1, 600, np.random.default_rng(1), True)
    live = LiveRow(model, rows[0], history_from=100.0)
    acts, why = alert_acts("governed", model, 1, live, 250.0, started_at=100.0, first_cycle=101.0)
    assert not acts and "notify" in why
    # The gate it replaced acts on a restarted daemon that has not evaluated yet, and on the thin
    # evidence of its first minutes at 4 req/s.
    gated = _gated(model)
    acts, why = alert_acts("gate", gated, 1, LiveRow(gated, rows[0], 100.0), 100.5, 100.0, 101.0)
    assert acts and "not evaluated" in why
    acts, why = alert_acts("gate", gated, 1, LiveRow(gated, rows[0], 100.0), 160.0, 100.0, 101.0)
    assert acts and "the alert acts" in why


def test_no_candidates_without_slow_requests(models: dict[str, PolicyModel]) -> None:
    model = models["ranker-histogram.yaml"]
    levels = screen_levels(model, Traffic(40.0))
    row = simulate(Traffic(40.0), Fault(0.0, 900), 1, 600, np.random.default_rng(1), False)[0]
    assert candidates(model, row, levels, 0.0).size == 0


def test_screen_finds_what_every_cycle_finds(models: dict[str, PolicyModel]) -> None:
    """Brute force on a few rows: the live detector polled at every cycle after the start test's
    verdict against the screened run."""
    model = models["ranker-istio.yaml"]
    traffic = Traffic(40.0)
    rows = simulate(traffic, Fault(0.0015, 900), 3, 1500, np.random.default_rng(11), False)
    screened = run_rows(Setup(model, traffic, None, "governed"), rows)
    for i, row in enumerate(rows):
        fire, starts = start_fire(model, row)
        live = LiveRow(model, row, -math.inf)
        live.detector.restore_starts(starts)
        brute, t = math.inf, model.interval
        while t < 1499 and t < fire:
            if live.fired(t):
                brute = t
                break
            t += model.interval
        assert screened.at[i] == min(brute, fire)


def test_on_counters_the_screen_polls_where_counted_steps_cross(models: dict[str, PolicyModel]) -> None:
    """A breach of light slow requests (0.2% at 600 ms) weighs little as latency mass; the live
    detector counts it per step. A screen on mass alone polled too little (24% of mid-life rows
    rolled back within 10 minutes, against 100% polled by counts): it must poll where counts cross."""
    from evaluation.operating_curve.policies import Screen
    model = models["ranker.yaml"]
    screen = screen_levels(model, Traffic(40.0))
    assert screen.count_levels is not None
    rows = simulate(Traffic(40.0), Fault(0.002, 600), 8, 600, np.random.default_rng(5), True,
                    onset=0.0, before=Fault(0.0005, 900))
    mass_only = Screen(screen.levels)
    found = [candidates(model, row, screen, 0.0) for row in rows]
    assert all(set(candidates(model, row, mass_only, 0.0).tolist()) <= set(f.tolist()) for row, f in zip(rows, found))
    assert sum(f.size > 0 for f in found) >= 6
