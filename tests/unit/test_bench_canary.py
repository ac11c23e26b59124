"""The canary benchmark's pieces at unit speed: at 10% of 400 req/s the judge decides the reference
defect on every seed, gives no verdict on a healthy canary, and calls a shared slowdown no
verdict where the single-version test on the canary alone fires; the Mann-Whitney judge's alpha
tuning keeps its false verdicts at the stated rate."""
from __future__ import annotations

import numpy as np

from bench.bench_canary import DEFECT, HEALTHY, SHARED, SHARED_LEAD, checks, deciders, history, start_share
from detectors.tail_excess import TailExcessParams
from evaluation.operating_curve.kayenta import start_alpha_cap, start_lowest_p, tune_alpha, verdicts_below
from evaluation.operating_curve.pair_runs import pair_delays
from evaluation.operating_curve.pairs import Split

PARAMS = TailExcessParams(line=500.0, evidence="histogram")
SPLIT = Split(400.0, 0.1)
SEEDS = range(1, 4)


def _delays(case, start: float = 0.0):
    return pair_delays(deciders(PARAMS, None, SPLIT), SPLIT, case, SEEDS, 600.0, history(PARAMS) + SHARED_LEAD, 500.0,
                       canary_start=start)


def test_the_reference_defect_is_judged_on_every_seed_and_as_fast_as_the_canary_alone():
    found = _delays(DEFECT)
    judge, single = found["judge"], found["single-version"]
    assert np.all(np.isfinite(judge)) and np.all(judge <= 120.0)
    assert np.median(judge) <= 1.2 * np.median(single)


def test_a_healthy_canary_gets_no_verdict():
    found = _delays(HEALTHY)
    assert np.all(np.isnan(found["judge"])) and np.all(np.isnan(found["single-version"]))


def test_a_shared_slowdown_is_not_the_canarys_fault():
    found = _delays(SHARED, start=-SHARED_LEAD)
    assert np.all(np.isnan(found["judge"]))
    assert np.all(np.isfinite(found["single-version"]))  # the canary alone is slow: what the judge avoids


def test_mann_whitney_alpha_holds_the_stated_rate():
    days, stated = 40, 1.0 / 30.0
    alpha, verdicts, smallest = tune_alpha(SPLIT, days, stated)
    assert 0.0 < alpha <= 0.05 and smallest > 0.0
    assert verdicts <= stated * days


def test_mann_whitney_tuned_on_days_alone_breaks_the_judges_promise_per_start_and_the_cap_keeps_it():
    # At 4 req/s on the canary a young canary's two minutes against ten give p = 1/66: an alpha tuned
    # on version-days alone (0.05 here) spends false verdicts there that the judge does not.
    split = Split(40.0, 0.1)
    share = start_share(PARAMS)
    lowest = start_lowest_p(split, 3000, 900.0)
    assert verdicts_below(lowest, 0.05) > 2 * share * lowest.size
    cap = start_alpha_cap(lowest, share)
    assert cap < 0.05
    assert verdicts_below(lowest, cap) <= share * lowest.size
    above = lowest[lowest > cap]
    assert verdicts_below(lowest, float(above[0])) > share * lowest.size  # the cap is the largest such alpha
    alpha, _, _ = tune_alpha(split, 20, 1.0 / 30.0, cap=cap)
    assert alpha <= cap


def test_the_done_when_checks_fail_a_slow_judge():
    from bench.bench_canary import Row

    def row(case, name, delays, per_day=None):
        return Row(SPLIT, case, name, np.array(delays, dtype=float), per_day)

    fast = [row(DEFECT, "judge", [30, 40, 50]), row(DEFECT, "single-version", [30, 40, 50]),
            row(DEFECT, "Mann-Whitney", [180, 180, 240]), row(HEALTHY, "judge", [np.nan] * 3, 0.0),
            row(SHARED, "judge", [np.nan] * 3, 0.0)]
    assert all(ok for ok, _ in checks(fast))
    slow = [row(DEFECT, "judge", [60, 80, 100]), *fast[1:3], row(HEALTHY, "judge", [np.nan, 300, np.nan], 0.0),
            fast[4]]
    verdicts = dict((line.split(":")[0], ok) for ok, line in checks(slow))
    assert not all(verdicts.values())
    assert [ok for ok, line in checks(slow) if line.startswith("zero shifts")] == [False]
