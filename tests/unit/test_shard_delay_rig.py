"""The rig of bench/bench_shard_delays.py: its fake Prometheus answers a range query as Prometheus
evaluates one (each grid point the newest scrape at or before it, never a scrape after the wall
clock), so the replay reads what a replica read; and the replay finds the reference defect after
its onset, on a scrape."""
from __future__ import annotations

import math

import numpy as np

from bench.shard_delay_rig import BUCKET, COUNT, SCRAPE, FakePrometheus, make_target, replay
from detectors.tail_excess import TailExcessParams

ONSET = 1.8e9


def test_an_answer_holds_the_newest_scrape_at_or_before_each_grid_point_and_none_after_the_clock() -> None:
    target = make_target("m0", 3, ONSET, 120)
    fake = FakePrometheus({"m0": target}, clock=lambda: ONSET + 64.5)
    # A replica's grid is off the scrapes' (the client rounds start and end to the second), and its end,
    # rounded up, may pass the clock: that point holds the scrape before the clock (60), not the one at 65.
    answer = fake.answer(f'{COUNT}{{model="m0"}}', ONSET - 38, ONSET + 65, SCRAPE)
    stamps = np.array([t for t, _ in answer[0]["values"]])  # type: ignore[attr-defined]
    values = np.array([float(v) for _, v in answer[0]["values"]])  # type: ignore[attr-defined]
    assert stamps[0] == ONSET - 38 and stamps[-1] == ONSET + 62 and np.all(np.diff(stamps) == SCRAPE)
    count, below = target.counters(np.floor(stamps / SCRAPE) * SCRAPE)
    assert np.array_equal(values, count) and np.all(np.diff(values) > 0)
    late = fake.answer(f'{COUNT}{{model="m0"}}', ONSET - 35, ONSET + 65, SCRAPE)[0]["values"]
    assert late[-1][0] == ONSET + 65 and float(late[-1][1]) == target.counters(np.array([ONSET + 60]))[0][0]  # type: ignore[index]
    bucket = fake.answer(f'{BUCKET}{{model="m0", le="500"}}', ONSET - 38, ONSET + 65, SCRAPE)
    assert bucket[0]["metric"]["le"] == "500"  # type: ignore[index]
    assert np.array_equal(np.array([float(v) for _, v in bucket[0]["values"]]), below)  # type: ignore[attr-defined]
    assert np.all(count - below >= 0) and count[-1] - below[-1] > count[0] - below[0]  # slow requests after the onset
    assert [(p.model, p.newest) for p in fake.polls] == [("m0", ONSET + 62), ("m0", ONSET + 65), ("m0", ONSET + 62)]
    assert fake.answer('other{model="m9"}', ONSET, ONSET + 5, SCRAPE) == []


def test_the_replay_fires_on_the_reference_defect_after_its_onset_on_a_scrape() -> None:
    params = TailExcessParams.model_validate({"line": 500, "line_unit": "ms", "evidence": "histogram"})
    delay = replay(make_target("m0", 101, ONSET, 300), params, ONSET - 60, ONSET + 300)
    assert 0 < delay < 300 and math.isclose(delay % SCRAPE, 0.0)
