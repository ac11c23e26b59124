"""tail_excess's start test (detectors/tail_excess_start.py, detectors/sequential/start_test.py): a
version whose first request this detector sees is tested from that request beside the bank, at a
stated probability per deploy; a version serving when the detector first looks is not; the settle
keeps a deploy's own held requests out; bad input is a reason, never a fire nor a crash."""
from __future__ import annotations

import math

import numpy as np
import pytest

from core.detection import Detection
from core.query import Series
from detectors.sequential.design import BankDesign
from detectors.sequential.start_test import bank_days, crossing_probability, start_bounds
from detectors.sequential.thresholds import STORE
from detectors.tail_excess import TailExcessDetector
from detectors.tail_excess_start import RemembersStarts

STEP = 1.0
PARAMS = {"line": 500, "evidence": "histogram"}


def _version(version: str, begin: int, end: int, rate: float, share: float, seed: int,
             held: tuple[float, float] = (0.0, 0.0), label: bool = True,
             gap: tuple[int, int] | None = None, reset_at: int | None = None) -> tuple[Series, Series]:
    """The bucket at the line and the count of one version from `begin` (its counters at zero, its
    first requests in the next step) to `end`, 1 s steps: Poisson(rate) requests a step, each above
    the line with `share`; `held`: (seconds, share) of the first steps' requests above the line (a
    model load holding them). `gap`: steps without a sample; `reset_at`: counters back to zero."""
    rng = np.random.default_rng(seed)
    t = np.arange(begin, end + 1, dtype=np.float64)
    n = rng.poisson(rate, t.size).astype(np.float64)
    n[0] = 0.0  # the first sample sees the counters at zero
    p = np.where(t - begin <= held[0], held[1], share) if held[0] > 0 else np.full(t.size, share)
    slow = rng.binomial(n.astype(np.int64), p).astype(np.float64)
    count, bucket = np.cumsum(n), np.cumsum(n - slow)
    if reset_at is not None:
        at = int(np.searchsorted(t, reset_at))
        count[at:] -= count[at - 1] + 1.0  # back to about zero: the counter went down
        bucket[at:] -= bucket[at - 1] + 1.0
        count[at:], bucket[at:] = np.maximum(count[at:], 0.0), np.maximum(bucket[at:], 0.0)
    keep = np.ones(t.size, dtype=bool)
    if gap is not None:
        keep &= ~((t >= gap[0]) & (t < gap[1]))
    labels = {"version": version} if label else {"pod": f"p{version}"}
    return (Series({**labels, "le": "500"}, t[keep].tolist(), bucket[keep].tolist()),
            Series(labels, t[keep].tolist(), count[keep].tolist()))


def _cut(s: Series, now: float, lookback: float) -> Series:
    ts = np.asarray(s.timestamps)
    keep = (ts <= now) & (ts > now - lookback)
    return Series(s.labels, ts[keep].tolist(), np.asarray(s.values)[keep].tolist())


def _cycles(det: TailExcessDetector, versions: list[tuple[Series, Series]], start: float, end: float,
            every: float = 5.0) -> list[tuple[float, list[Detection]]]:
    """The detector's verdicts every `every` seconds from `start` to `end`, each on the range the
    poller would fetch (the detector's lookback), series with no point in it left out."""
    out = []
    now = start
    while now <= end:
        lookback = det.lookback_seconds
        pairs = [(_cut(b, now, lookback), _cut(c, now, lookback)) for b, c in versions]
        pairs = [(b, c) for b, c in pairs if b.timestamps]
        out.append((now, det.detect_many([b for b, _ in pairs], now, [c for _, c in pairs])))
        now += every
    return out


def _first_fire(timeline: list[tuple[float, list[Detection]]]) -> tuple[float, Detection] | None:
    return next(((now, d) for now, ds in timeline for d in ds if d.fired), None)


@pytest.fixture(scope="module", autouse=True)
def _derived() -> None:
    """The bank's thresholds derived at every traffic cell the tests meet, a new version's first
    cycles included (the start test needs none): an underived cell answers Wald's slower thresholds,
    and what the bank does would then depend on which tests ran before."""
    v1, v2 = _version("1", 0, 1400, 40.0, 0.0005, 1), _version("2", 1000, 1400, 40.0, 0.005, 2)
    _cycles(TailExcessDetector(PARAMS), [v1, v2], 950, 1400)
    assert STORE.wait()


def test_a_deploy_seen_by_the_detector_is_tested_from_its_first_request() -> None:
    v1 = _version("1", 0, 1400, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 1400, 40.0, 0.005, 2)
    det = TailExcessDetector(PARAMS)
    timeline = _cycles(det, [v1, v2], 950, 1400)
    first = _first_fire(timeline)
    assert first is not None and first[1].details["version"] == "2" and first[0] - 1001 < 90
    # The bank may cross first on a 5x breach (its 10x member); the start test fires on the same version.
    fired = next(((now, d) for now, ds in timeline for d in ds if d.reason.startswith("start test:")), None)
    assert fired is not None
    now, d = fired
    assert d.details["version"] == "2" and d.fired
    start = d.details["start_test"]
    assert start["status"] == "fired" and start["started_at"] == 1001.0 and d.episode_start == 1001.0
    assert d.details["assumed"]["start_test"] == {"alpha_per_deploy": 0.001, "horizon_seconds": 900.0,
                                                  "settle_seconds": 5.0, "start_below_requests": 1000.0,
                                                  "started_at": 1001.0}
    assert now - 1001 < 90
    assert d.details["series_first_seen"] == 1000.0 and d.details["onset_after_first_sample_s"] == 1.0
    # The bank alone (no start test) is later on the same arrivals.
    # The start test never makes the detector later than the bank alone on the same arrivals.
    alone = _first_fire(_cycles(TailExcessDetector({**PARAMS, "start_false_alarms": 0}), [v1, v2], 950, 1400))
    assert alone is None or alone[0] >= first[0]
    assert det.take_new_starts() == [("2", 1001.0)] and isinstance(det, RemembersStarts)


def test_the_start_is_handed_over_once_for_the_journal() -> None:
    v1 = _version("1", 0, 1100, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 1100, 40.0, 0.0005, 3)
    det = TailExcessDetector(PARAMS)
    _cycles(det, [v1, v2], 950, 990)
    assert det.take_new_starts() == []
    _cycles(det, [v1, v2], 1010, 1010)
    assert det.take_new_starts() == [("2", 1001.0)]
    _cycles(det, [v1, v2], 1020, 1030)
    assert det.take_new_starts() == []


def test_a_version_serving_when_the_detector_first_looks_gets_no_start_test_unless_journaled() -> None:
    v1 = _version("1", 0, 1300, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 1300, 40.0, 0.005, 2)
    cold = TailExcessDetector(PARAMS)
    timeline = _cycles(cold, [v1, v2], 1020, 1300)
    assert all("start_test" not in d.details for _, ds in timeline for d in ds)
    assert cold.take_new_starts() == []
    # A restart that reads the journaled start resumes the same test: the same verdict as if it had run.
    warm = TailExcessDetector(PARAMS)
    warm.restore_starts({"2": 1001.0})
    resumed = _first_fire(_cycles(warm, [v1, v2], 1020, 1300))
    never_stopped = _first_fire(_cycles(TailExcessDetector(PARAMS), [v1, v2], 950, 1300))
    assert resumed is not None and never_stopped is not None
    assert resumed[1].episode_start == never_stopped[1].episode_start == 1001.0
    assert resumed[1].details["start_test"]["fired_at"] == never_stopped[1].details["start_test"]["fired_at"]
    assert warm.take_new_starts() == []  # known: nothing new to journal


def test_requests_held_by_the_model_load_are_not_evidence() -> None:
    # A healthy deploy whose first 3 s of requests are all above the line (held by a slow load):
    # the step that holds the first request is never scored, the next two only without a settle.
    v1 = _version("1", 0, 1400, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 1400, 40.0, 0.0005, 4, held=(3.0, 1.0))
    unsettled = _first_fire(_cycles(TailExcessDetector({**PARAMS, "start_settle_seconds": 0}), [v1, v2], 950, 1100))
    assert unsettled is not None and unsettled[1].details["version"] == "2"
    settled = _cycles(TailExcessDetector(PARAMS), [v1, v2], 950, 1400)
    assert _first_fire(settled) is None
    last = settled[-1][1][1]
    assert last.details["start_test"]["status"] == "running" and last.details["start_test"]["scored_steps"] > 390


def test_a_healthy_deploy_runs_its_horizon_and_ends_without_firing() -> None:
    v1 = _version("1", 0, 2100, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 2100, 40.0, 0.0005, 5)
    timeline = _cycles(TailExcessDetector(PARAMS), [v1, v2], 950, 2100, every=50.0)
    assert _first_fire(timeline) is None
    assert timeline[-1][1][1].details["start_test"]["status"] == "ended"


def test_bad_input_deploy_seen_twice_keeps_the_earliest_start() -> None:
    det = TailExcessDetector(PARAMS)
    det.restore_starts({"2": 1001.0})
    det.restore_starts({"2": 1201.0, "3": float("nan")})
    v1 = _version("1", 0, 1300, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 1300, 40.0, 0.0005, 6)
    timeline = _cycles(det, [v1, v2], 1200, 1300)
    d = timeline[-1][1][1]
    assert d.details["start_test"]["started_at"] == 1001.0
    assert any("one start test per version" in n for n in d.details["start_test"]["notes"])
    assert _first_fire(timeline) is None


def test_bad_input_a_version_that_disappears_and_returns_is_not_a_second_start() -> None:
    v1 = _version("1", 0, 1300, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 1300, 40.0, 0.0005, 7, gap=(1050, 1100))
    det = TailExcessDetector(PARAMS)
    timeline = _cycles(det, [v1, v2], 950, 1300)
    assert det.take_new_starts() == [("2", 1001.0)]
    assert _first_fire(timeline) is None
    d = timeline[-1][1][1]
    assert d.details["start_test"]["started_at"] == 1001.0
    assert any("disappeared and returned" in n for n in d.details["start_test"]["notes"])
    # Gone from the answer altogether while its test runs: said on the detection, nothing fires.
    gone = _cycles(det, [v1], 1310, 1310)[0][1][0]
    assert "version 2 (started 1001) is no longer served" in gone.reason and not gone.fired
    assert gone.details["unserved_starts"] == {"2": 1001.0}


def test_bad_input_counters_reset_mid_test_stop_the_start_test() -> None:
    # After the reset the version is far above budget: only the bank may say so, not the start test.
    v1 = _version("1", 0, 1200, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 1200, 40.0, 0.0005, 8, reset_at=1060)
    det = TailExcessDetector(PARAMS)
    timeline = _cycles(det, [v1, v2], 950, 1200)
    assert _first_fire(timeline) is None
    stopped = [d for _, ds in timeline for d in ds if d.details.get("start_test", {}).get("status") == "stopped"]
    assert stopped and "counters reset" in stopped[-1].reason


def test_bad_input_series_without_the_version_label_are_said() -> None:
    v1 = _version("1", 0, 1100, 40.0, 0.0005, 1)
    bare = _version("x", 1000, 1100, 40.0, 0.05, 9, label=False)
    timeline = _cycles(TailExcessDetector(PARAMS), [v1, bare], 950, 1100)
    d = timeline[-1][1][1]
    assert "no start test: the series has no 'version' label" in d.reason
    assert d.details["start_test"]["status"] == "no_version_label"
    assert not any(x.reason.startswith("start test:") for _, ds in timeline for x in ds)


def test_bad_input_a_journaled_start_of_a_version_no_longer_served() -> None:
    det = TailExcessDetector(PARAMS)
    det.restore_starts({"7": 1001.0})
    v1 = _version("1", 0, 1100, 40.0, 0.0005, 1)
    d = _cycles(det, [v1], 1100, 1100)[0][1][0]
    assert not d.fired and "version 7 (started 1001) is no longer served" in d.reason


def test_a_version_already_serving_before_the_range_is_not_a_start() -> None:
    # Its series first seen mid-answer with a counter far past the stated count, nobody serving alone before.
    det = TailExcessDetector(PARAMS)
    v1 = _version("1", 0, 1100, 40.0, 0.0005, 1)
    _cycles(det, [v1], 1000, 1000)
    b, c = _version("2", 1050, 1100, 40.0, 0.0005, 2)
    late = (Series(b.labels, b.timestamps, [v + 50_000 for v in b.values]),
            Series(c.labels, c.timestamps, [v + 50_000 for v in c.values]))
    d = _cycles(det, [(Series(v1[0].labels, v1[0].timestamps[1040:], v1[0].values[1040:]),
                       Series(v1[1].labels, v1[1].timestamps[1040:], v1[1].values[1040:])), late], 1100, 1100)[0][1]
    assert det.take_new_starts() == [] and "start_test" not in d[1].details


@pytest.mark.parametrize("lump", [1.0, 2.0])
def test_the_exact_bound_holds_its_probability(lump: float) -> None:
    """Monte Carlo of null starts as live steps make them (a Poisson number of requests a step,
    Poisson events of `lump` units at the null, looked at after each step) against the bound for
    0.05 per start: crossed at most 0.05 of the time, and not far below (the bound is tight)."""
    design = BankDesign.for_budget(0.001, 0.5, lump=lump)
    n, steps, alpha = 40.0, 300, 0.05
    bound = start_bounds(design, alpha, n, steps)[0]
    rng = np.random.default_rng(11)
    requests = rng.poisson(n, (20_000, steps)).astype(np.float64)
    units = lump * rng.poisson(design.events * requests).astype(np.float64)
    cu, cn = np.cumsum(units, axis=1), np.cumsum(requests, axis=1)
    stat = np.asarray(design.jumps)[:, None, None] * cu[None] - np.asarray(design.drains)[:, None, None] * cn[None]
    crossed = float((stat >= bound).any(axis=(0, 2)).mean())
    assert crossed <= alpha
    assert crossed >= 0.2 * alpha


@pytest.mark.parametrize("lump", [1.0, 2.0])
def test_the_recursion_is_the_probability_of_crossing_at_any_request(lump: float) -> None:
    """The recursion against a simulation that looks after every event (the most any grid of steps
    can cross): the same probability. A recursion that looked once per mean step missed the
    crossings small steps make early, and the live test's false starts ran ~20% over its rate."""
    design = BankDesign.for_budget(0.001, 0.5, lump=lump)
    n, steps, bound = 40.0, 300, 3.5
    total = n * steps
    rng = np.random.default_rng(12)
    most = int(design.events * total + 12 * math.sqrt(design.events * total) + 40)
    at = np.cumsum(rng.exponential(1.0 / design.events, (20_000, most)), axis=1)  # events, in requests
    count = np.arange(1, most + 1, dtype=np.float64)
    stat = (np.asarray(design.chain_jumps)[:, None, None] * count[None, None, :]
            - np.asarray(design.drains)[:, None, None] * at[None])
    crossed = float(((stat >= bound) & (at <= total)[None]).any(axis=(0, 2)).mean())
    assert crossing_probability(design, bound, n, steps) == pytest.approx(crossed, abs=0.006)
    assert crossed > 0.02  # a bound the test can tell apart


def test_the_bank_keeps_what_the_start_test_leaves_of_the_rate() -> None:
    test = TailExcessDetector(PARAMS).params.test()
    assert test.bank_days == pytest.approx(bank_days(30.0, 0.001)) and test.bank_days == pytest.approx(30.0 / 0.97)
    assert test.promise(1.0).days == test.bank_days
    off = TailExcessDetector({**PARAMS, "start_false_alarms": 0}).params.test()
    assert off.bank_days is None and off.promise(1.0).days == 30.0


def test_every_row_says_what_the_start_test_assumes_and_the_bank_keeps() -> None:
    """`tailguard status` shows a trigger's most telling verdict's `assumed`: the start test's rule
    and the bank's own promise are there on every row, a version in its start test adds its start."""
    v1 = _version("1", 0, 1100, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 1100, 40.0, 0.0005, 2)
    out = _cycles(TailExcessDetector(PARAMS), [v1, v2], 950, 1100)[-1][1]
    old, new = out[0].details["assumed"], out[1].details["assumed"]
    assert old["start_test"] == {"alpha_per_deploy": 0.001, "horizon_seconds": 900.0, "settle_seconds": 5.0,
                                 "start_below_requests": 1000.0}
    assert old["bank_false_alarm_days"] == pytest.approx(30.0 / 0.97) and old["false_alarm_days"] == 30.0
    assert new["start_test"]["started_at"] == 1001.0
    off = _cycles(TailExcessDetector({**PARAMS, "start_false_alarms": 0}), [v1, v2], 1100, 1100)[-1][1]
    assert "start_test" not in off[0].details["assumed"] and "bank_false_alarm_days" not in off[0].details["assumed"]


def _slow_from(pair: tuple[Series, Series], at: float, share: float, seed: int) -> tuple[Series, Series]:
    """A version's bucket with `share` of its requests from `at` on moved above the line."""
    bucket, count = pair
    rng = np.random.default_rng(seed)
    n = np.diff(np.asarray(count.values), prepend=0.0)
    slow = np.where(np.asarray(count.timestamps) > at, rng.binomial(n.astype(np.int64), share), 0)
    return Series(bucket.labels, bucket.timestamps, (np.asarray(bucket.values) - np.cumsum(slow)).tolist()), count


def test_a_slowdown_the_serving_versions_share_is_no_start_test_fire() -> None:
    v1 = _slow_from(_version("1", 0, 1300, 40.0, 0.0005, 1), 1000, 0.005, 21)
    v2 = _version("2", 1000, 1300, 40.0, 0.005, 2)
    timeline = _cycles(TailExcessDetector(PARAMS), [v1, v2], 950, 1300)
    assert not any(d.fired and d.reason.startswith("start test") for _, ds in timeline for d in ds)
    statuses = {d.details["start_test"]["status"] for _, ds in timeline for d in ds[1:] if "start_test" in d.details}
    assert statuses & {"shared", "held"}


def test_a_quiet_healthy_neighbour_holds_the_start_test_until_it_is_shown_below() -> None:
    # A neighbour at 5 req/s is shown below v2's ~0.5% after ~600 of its requests, two minutes.
    v1 = _version("1", 0, 1400, 5.0, 0.0005, 1)
    v2 = _version("2", 1000, 1400, 40.0, 0.005, 2)
    timeline = _cycles(TailExcessDetector(PARAMS), [v1, v2], 950, 1400)
    held = [now for now, ds in timeline if len(ds) > 1 and ds[1].details.get("start_test", {}).get("status") == "held"]
    fired = _first_fire(timeline)
    # Held as the bank's alarm is held (the same rule), both stand once v1 is shown below.
    assert held and fired is not None and fired[0] > held[-1]
    assert fired[1].details["start_test"]["status"] == "fired" and "start test: " in fired[1].reason
