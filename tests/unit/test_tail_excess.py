"""tail_excess: the counter CUSUM fires on a real P99.9 tail and stays quiet on healthy noise.

Counters are synthesized per second as Triton exports them (cumulative microseconds and
requests): 40 req/s at ~4 ms, and slow requests of 900 ms drawn the way the load generator of the
rig draws them (a seeded uniform per request, slow when below the fault rate).
"""
from __future__ import annotations

import numpy as np
import pytest

from core.query import Series
from detectors.registry import DETECTORS
from detectors._grid import align
from detectors.sequential.bank import first_alarms
from detectors.sequential.thresholds import STORE
from detectors.tail_excess import REPLACED, TailExcessDetector, TailExcessParams

RATE = 40  # requests per second
BULK_US = 4000.0
SLOW_US = 900_000.0
LINE_US = 500_000.0
START = 1_700_000_000.0


def counters(seconds: int, fault_rate: float = 0.0, onset: int = 0, seed: int = 1, step: int = 1,
             rate_at=lambda t: RATE, bulk_at=lambda t: BULK_US, stall_at: int | None = None,
             reset_at: int | None = None) -> tuple[Series, Series]:
    """(latency counter, request counter) sampled every `step` seconds for `seconds`."""
    rng = np.random.default_rng(seed)
    lat, req = [0.0], [0.0]
    for t in range(1, seconds + 1):
        n = int(rate_at(t))
        x = rng.random(n)
        slow = int(np.sum(x < fault_rate)) if t > onset else 0
        mass = (n - slow) * bulk_at(t) * rng.uniform(0.95, 1.05) + slow * SLOW_US
        if stall_at is not None and t == stall_at:
            mass += 4 * 1_500_000.0  # four requests held by a model load for 1.5 s
        if reset_at is not None and t == reset_at:
            lat.append(mass)
            req.append(float(n))
        else:
            lat.append(lat[-1] + mass)
            req.append(req[-1] + n)
    ts = tuple(START + t for t in range(0, seconds + 1, step))
    pick = slice(0, seconds + 1, step)
    labels = {"model": "ranker", "version": "2"}
    return (Series({"__name__": "lat", **labels}, ts, tuple(lat[pick])),
            Series({"__name__": "req", **labels}, ts, tuple(req[pick])))


def first_fire(det: TailExcessDetector, lat: Series, req: Series, after: int) -> float | None:
    """Seconds after `after` at which the detector first fires if evaluated at every sample.

    The test is causal (trailing bulk, running CUSUM) and these runs are shorter than its
    lookback, so one evaluation at the end holds the statistic every earlier cycle would have
    seen; `test_streaming_matches_one_evaluation` checks that equivalence."""
    grid, arrays = align([lat, req])
    batch = derived(det, grid, arrays)
    alarm, _, _ = first_alarms(batch.test.design, batch.units, batch.requests, batch.thresholds)
    if alarm[0] < 0:
        return None
    at = float(batch.timestamps[alarm[0]] - START - after)
    return at if at > 0 else None


def derived(det: TailExcessDetector, grid, arrays):
    """The batch evaluated once the thresholds for its traffic are derived (the first evaluation of
    a new traffic answers the Wald bound while they are derived in the background)."""
    det.evaluate(grid, arrays[:1], arrays[1:], float(grid[-1]))
    assert STORE.wait()
    return det.evaluate(grid, arrays[:1], arrays[1:], float(grid[-1]))


def upto(s: Series, seconds: float) -> Series:
    keep = [i for i, t in enumerate(s.timestamps) if t - START <= seconds]
    return Series(s.labels, tuple(s.timestamps[i] for i in keep), tuple(s.values[i] for i in keep))


DET = TailExcessDetector({"line": LINE_US})


def test_registered_and_line_required() -> None:
    assert DETECTORS["tail_excess"] is TailExcessDetector
    with pytest.raises(ValueError, match="line"):
        TailExcessParams.model_validate({})
    assert TailExcessParams.model_validate({"line": LINE_US}).recovery_rule is None  # counters hold no level


@pytest.mark.parametrize("params, message", [
    ({"input": "values"}, "`input: values` moved to its own detector: use `type: value_cusum`"),
    ({"input": "values", "values": {"direction": "both"}, "line": LINE_US}, "use `type: value_cusum`"),
    ({"values": {"direction": "both"}}, "use `type: value_cusum`"),
    ({"input": "counters", "line": LINE_US}, "takes counters only (delete the `input:` line); one value series is "
                                             "`type: value_cusum`"),
])
def test_the_value_path_is_gone_and_its_keys_name_value_cusum(params: dict, message: str) -> None:
    """`input` and `values` fail with one error that names the detector they moved to."""
    with pytest.raises(ValueError) as caught:
        TailExcessParams.model_validate(params)
    (error,) = caught.value.errors()  # one line, not one per key
    assert message in error["msg"] and error["msg"].startswith("tail_excess: `input")


@pytest.mark.parametrize("params", [{"line": LINE_US, "decision_threshold": 13},
                                    {"line": LINE_US, "rate_ratio": 10, "decision_threshold": 20}])
def test_the_bare_operating_point_is_gone_and_names_the_rate(params: dict) -> None:
    """decision_threshold and rate_ratio fail with one line naming false_alarm_days."""
    with pytest.raises(ValueError) as caught:
        TailExcessParams.model_validate(params)
    (error,) = caught.value.errors()
    assert error["msg"] == REPLACED and "false_alarm_days" in REPLACED


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_fires_on_a_half_percent_tail_and_names_the_version(seed: int) -> None:
    lat, req = counters(240, fault_rate=0.005, onset=120, seed=seed)
    delay = first_fire(DET, lat, req, after=120)
    assert delay is not None and delay < 110
    d = DET.detect(lat, START + 240, req)
    assert d.fired and d.details["version"] == "2"
    assert d.episode_start is not None and d.episode_start > START + 120
    assert d.details["episode_above_line"] / d.details["episode_requests"] > 0.001
    assert d.details["assumed"]["derived"] and d.details["assumed"]["false_alarm_days"] == 30


def test_episode_start_is_stable_across_cycles() -> None:
    lat, req = counters(300, fault_rate=0.01, onset=120, seed=7)
    starts = set()
    for end in range(200, 301, 10):
        d = DET.detect(upto(lat, end), START + end, upto(req, end))
        if d.fired:
            starts.add(d.episode_start)
    assert len(starts) == 1


def test_streaming_matches_one_evaluation() -> None:
    """Deciding at every second sees exactly what one evaluation at the end says about each second."""
    lat, req = counters(200, fault_rate=0.01, onset=100, seed=3)
    once = first_fire(DET, lat, req, after=100)  # first: it waits for the thresholds of this traffic
    streamed = next((t for t in range(101, 201) if DET.detect(upto(lat, t), START + t, upto(req, t)).fired), None)
    assert streamed is not None and once is not None and streamed - 100 == once


@pytest.mark.parametrize("seed", range(1, 9))
def test_quiet_when_slow_requests_stay_below_a_tenth_of_a_percent(seed: int) -> None:
    """0.05% of requests at 900 ms for ten minutes: slow requests, but no P99.9 incident."""
    lat, req = counters(720, fault_rate=0.0005, onset=120, seed=seed)
    assert first_fire(DET, lat, req, after=120) is None


def test_quiet_on_a_single_slow_request() -> None:
    lat, req = counters(300, seed=3)
    bump = tuple(v + (SLOW_US if i >= 200 else 0.0) for i, v in enumerate(lat.values))
    assert first_fire(DET, Series(lat.labels, lat.timestamps, bump), req, after=0) is None


def test_quiet_on_traffic_bursts_and_drops_that_slow_the_bulk() -> None:
    """3x traffic for a minute with the bulk 40% slower, then a drop to a third."""
    def rate(t: int) -> int:
        return 3 * RATE if 150 <= t < 210 else RATE // 3 if 270 <= t < 330 else RATE

    def bulk(t: int) -> float:
        return BULK_US * 1.4 if 150 <= t < 210 else BULK_US

    lat, req = counters(400, rate_at=rate, bulk_at=bulk, seed=5)
    assert first_fire(DET, lat, req, after=0) is None


def test_counter_reset_is_not_a_tail_and_is_reported() -> None:
    lat, req = counters(300, reset_at=200, seed=2)
    assert first_fire(DET, lat, req, after=0) is None
    assert DET.detect(lat, START + 300, req).details["counter_resets"] == 1


def test_gaps_are_skipped_and_a_tail_after_a_gap_still_fires() -> None:
    lat, req = counters(400, fault_rate=0.01, onset=250, seed=4)
    keep = [i for i in range(len(lat.timestamps)) if not 100 <= i < 160]
    lat = Series(lat.labels, tuple(lat.timestamps[i] for i in keep), tuple(lat.values[i] for i in keep))
    req = Series(req.labels, tuple(req.timestamps[i] for i in keep), tuple(req.values[i] for i in keep))
    assert first_fire(DET, lat, req, after=0) is not None
    assert DET.detect(upto(lat, 240), START + 240, upto(req, 240)).fired is False


def test_prometheus_step_of_five_seconds_also_fires() -> None:
    lat, req = counters(300, fault_rate=0.01, onset=120, seed=1, step=5)
    assert first_fire(DET, lat, req, after=120) is not None


def test_stale_missing_companion_and_no_history_are_not_decisions() -> None:
    lat, req = counters(200, fault_rate=0.05, onset=50, seed=1)
    assert "stale" in DET.detect(lat, START + 400, req).reason
    assert "companionQuery" in DET.detect(lat, START + 200, None).reason
    one = Series(lat.labels, lat.timestamps[:1], lat.values[:1])
    d = DET.detect(one, START, Series(req.labels, req.timestamps[:1], req.values[:1]))
    assert not d.fired and "history" in d.reason


def test_a_series_with_more_timestamps_than_values_is_malformed_not_a_raise() -> None:
    lat, req = counters(200, fault_rate=0.05, onset=50, seed=1)
    for short in (Series(lat.labels, lat.timestamps, lat.values[:-3]), Series(lat.labels, lat.timestamps[:-3], lat.values)):
        d = DET.detect(short, START + 200, req)
        assert not d.fired and d.reason.startswith("malformed series") and "lengths" in d.reason, d.reason


def test_batch_path_decides_each_row_like_the_single_path() -> None:
    pairs = [counters(300, fault_rate=rate, onset=150, seed=s)
             for s, rate in [(1, 0.0), (2, 0.01), (3, 0.0005), (4, 0.02)]]
    lats = [Series({**lat.labels, "instance": str(i)}, lat.timestamps, lat.values) for i, (lat, _) in enumerate(pairs)]
    reqs = [Series({**req.labels, "instance": str(i)}, req.timestamps, req.values) for i, (_, req) in enumerate(pairs)]
    many = DET.detect_many(lats, START + 300, reqs)
    single = [DET.detect(lat, START + 300, req) for lat, req in zip(lats, reqs)]
    assert [d.fired for d in many] == [d.fired for d in single]
    assert [d.fired for d in many] == [False, True, False, True]
