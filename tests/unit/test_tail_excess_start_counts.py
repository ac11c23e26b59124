"""The start test on Triton's latency counters (detectors/tail_excess_start_evidence.py): slow
requests counted per step, one a step whatever its size, never latency mass. A healthy version
whose rare slow requests are heavy (0.05% at 3,000 ms: one at 6x the line is one request above it,
not six) is not rolled back, a breach from the deploy is, and where steps are too long to count
the start test does not run and says why."""
from __future__ import annotations

import numpy as np

from core.query import Series
from detectors.tail_excess import TailExcessDetector
from detectors.tail_excess_start_evidence import start_counts
from tests.unit.test_tail_excess_start import _cycles, _first_fire

PARAMS = {"line": 500, "evidence": "counters"}  # the line in the counters' unit (ms here)
BULK_MS = 5.0


def _counters(version: str, begin: int, end: int, rate: float, share: float, slow_ms: float,
              seed: int) -> tuple[Series, Series]:
    """Cumulative latency (ms) and requests of one version from `begin` (counters at zero) to
    `end`, 1 s steps: Poisson(rate) requests a step at ~BULK_MS, each slow (`slow_ms`) with `share`."""
    rng = np.random.default_rng(seed)
    t = np.arange(begin, end + 1, dtype=np.float64)
    n = rng.poisson(rate, t.size).astype(np.float64)
    n[0] = 0.0
    slow = rng.binomial(n.astype(np.int64), share).astype(np.float64)
    latency = (n - slow) * BULK_MS * rng.uniform(0.9, 1.1, t.size) + slow * slow_ms
    labels = {"version": version}
    return (Series(labels, t.tolist(), np.cumsum(latency).tolist()), Series(labels, t.tolist(), np.cumsum(n).tolist()))


def _slow_requests(pair: tuple[Series, Series], begin: float, end: float, slow_ms: float) -> int:
    """How many slow requests the version served in (begin, end], read back from its counters."""
    lat, req = np.asarray(pair[0].values), np.asarray(pair[1].values)
    ts = np.asarray(pair[0].timestamps)
    d_lat, d_req = np.diff(lat), np.diff(req)
    step_ends = ts[1:]
    inside = (step_ends > begin) & (step_ends <= end)
    return int(np.round((d_lat[inside] - d_req[inside] * BULK_MS) / (slow_ms - BULK_MS)).clip(min=0).sum())


def test_a_lone_slow_request_counts_one_whatever_its_size_and_the_first_steps_count_once_the_bulk_is_known() -> None:
    steps = 40
    requests = np.full((2, steps), 40.0)
    latency = requests * BULK_MS
    for row, slow_ms in ((0, 900.0), (1, 3000.0)):
        latency[row, 2] += slow_ms - BULK_MS  # in the version's third step: before the bulk is known
        latency[row, 30] += slow_ms - BULK_MS
    latency += np.random.default_rng(1).uniform(-5.0, 5.0, latency.shape)
    units, counted_requests, known_from = start_counts(latency, requests, 500.0, 0.0005, (60, 600, 60), 0.1)
    assert np.nansum(units, axis=1).tolist() == [2.0, 2.0]  # 900 ms and 3,000 ms: one request each
    assert units[0, 2] == 1.0 and units[1, 2] == 1.0
    assert np.isfinite(counted_requests[:, 1:]).all() and (known_from > 2).all()  # the third step known later


def test_a_healthy_version_with_heavy_rare_slow_requests_is_not_rolled_back_by_its_start_test() -> None:
    v1 = _counters("1", 0, 2100, 40.0, 0.0005, 900.0, 1)
    v2 = _counters("2", 1000, 2100, 40.0, 0.0005, 3000.0, 2)
    v1 = (Series(v1[0].labels, v1[0].timestamps[:1001], v1[0].values[:1001]),
          Series(v1[1].labels, v1[1].timestamps[:1001], v1[1].values[:1001]))  # a full rollout
    det = TailExcessDetector(PARAMS)
    timeline = _cycles(det, [v1, v2], 990, 1900)  # the horizon ends at 1906
    assert _first_fire(timeline) is None
    start = next(d for d in timeline[-1][1] if d.details.get("version") == "2").details["start_test"]
    assert start["status"] == "running"
    slow = _slow_requests(v2, start["started_at"] + start["settle_seconds"], 1900.0, 3000.0)
    assert slow >= 10  # heavy enough that latency mass (about 6 units each) would have crossed
    assert start["above_line"] == slow  # counted as requests, not as their latency's worth


def test_a_breach_from_the_deploy_is_found_by_the_start_test_on_counters() -> None:
    v1 = _counters("1", 0, 1000, 40.0, 0.0005, 900.0, 3)
    v2 = _counters("2", 1000, 1300, 40.0, 0.005, 900.0, 4)
    det = TailExcessDetector(PARAMS)
    fire = _first_fire(_cycles(det, [v1, v2], 990, 1300))
    assert fire is not None
    at, d = fire
    assert d.details["version"] == "2" and d.reason.startswith("start test:") and at - 1000 < 120


def test_steps_too_long_to_count_run_no_start_test_and_say_why() -> None:
    # 2,000 req/s on 1 s steps: a step with a request above the line at 0.2% holds two or more 92%
    # of the time, so a step's excess cannot say how many it holds.
    v1 = _counters("1", 0, 1000, 2000.0, 0.0005, 900.0, 5)
    v2 = _counters("2", 1000, 1060, 2000.0, 0.005, 900.0, 6)
    det = TailExcessDetector(PARAMS)
    timeline = _cycles(det, [v1, v2], 990, 1060)
    start = next(d for d in timeline[-1][1] if d.details.get("version") == "2").details["start_test"]
    assert start["status"] == "none" and "steps too long to count" in start["reason"]
    assert not any(d.fired and d.reason.startswith("start test") for _, ds in timeline for d in ds)


def test_slow_requests_in_a_versions_first_steps_leave_the_later_ones_counted() -> None:
    """Two slow requests in a version's first three steps: the bulk's centre is not read from pools
    that hold them (it would be the lumps' own mean, the steps after would read as sub-line lumps and
    wide noise, and for the window's ten minutes no lone slow request would pass the threshold).
    Every slow request of the run counts once, the early ones once the bulk is known."""
    steps = 120
    requests = np.full((1, steps), 39.0)  # under 40 a step: the bulk is pooled over two steps
    latency = requests * BULK_MS + np.random.default_rng(2).uniform(-5.0, 5.0, (1, steps))
    slow_at = [0, 2, 17, 21, 22, 23, 33, 42, 44, 65, 76, 78]  # seed 18's first minutes, 900 ms each
    for col in slow_at:
        latency[0, col] += 900.0 - BULK_MS
    units, _, known_from = start_counts(latency, requests, 500.0, 0.0005, (60, 600, 60), 0.25)
    assert np.flatnonzero(np.nan_to_num(units[0]) > 0).tolist() == slow_at
    assert 0 < known_from[0] < 40
