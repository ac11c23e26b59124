"""A count that cannot see a breach is no sight of the target (core.detection.sees_target): on
Triton's counters a bulk whose stalls put sub-line lumps in many steps raises what a lone slow
request must pass to count (detectors/_slow_counts.py), past 1.5x the line; such a row is
`blind_near_line`, and a cycle of only such rows does not refresh the governed alert rule's
evidence, so its backstop can act on a breach the count cannot see (found on the real stack: a
900 ms breach unseen for 180 s while counting needed 986 ms)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from core.detection import Detection, DetectorStatus, sees_target
from core.query import Series
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import RangeResult
from daemon.storage.journal import Journal
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.poller import Poller
from detectors.tail_excess import TailExcessDetector
from policies.loader import load_policies_text


def _counters(seconds: int, lump_share: float, seed: int) -> tuple[Series, Series]:
    """40 req/s at ~5 ms for `seconds`; in `lump_share` of the steps one request stalls 300-480 ms
    (below the 500 ms line); no request above the line."""
    rng = np.random.default_rng(seed)
    n = rng.poisson(40.0, seconds + 1).astype(np.float64)
    n[0] = 0.0
    lat = n * 5.0 * rng.uniform(0.9, 1.1, n.size)
    lumps = rng.random(n.size) < lump_share
    lat += np.where(lumps, rng.uniform(300.0, 480.0, n.size), 0.0)
    t = (1_000.0 + np.arange(seconds + 1)).tolist()
    labels = {"version": "1"}
    return Series(labels, t, np.cumsum(lat).tolist()), Series(labels, t, np.cumsum(n).tolist())


def _last(lump_share: float) -> Detection:
    lat, req = _counters(900, lump_share, 3)
    det = TailExcessDetector({"line": 500, "evidence": "counters"})
    (d,) = det.detect_many([lat], lat.timestamps[-1], [req])
    return d


def test_a_stalling_bulk_makes_the_count_blind_near_the_line_and_a_calm_one_does_not() -> None:
    blind = _last(0.2)
    assert blind.blind_near_line and "counts only above" in blind.reason, blind.reason
    calm = _last(0.0)
    assert not calm.blind_near_line and calm.status is DetectorStatus.OK


def test_sight_is_any_decided_row_that_is_not_blind() -> None:
    ok = Detection("tail_excess", False, "ok")
    blind = Detection("tail_excess", False, "blind", blind_near_line=True)
    stale = Detection("tail_excess", False, "stale", status=DetectorStatus.STALE)
    assert sees_target([ok]) and sees_target([ok, blind]) and sees_target([stale])
    assert not sees_target([blind]) and not sees_target([blind, stale])
    assert sees_target([])


POLICY = """
name: tail
target: {model: ranker}
triggers:
  - detector:
      type: tail_excess
      query: 'lat{model="$model"}'
      companionQuery: 'req{model="$model"}'
      interval: 1s
      params: {line: 500}
actions:
  - type: notify
    url: http://127.0.0.1:9/hook
guards: {cooldown: 0s}
verify: {query: 'vector(0)', below: 1, onNotRecovered: none}
"""


class _ByName:
    """A Prometheus answering each query with the series of its metric name."""

    def __init__(self, series: dict[str, Series]) -> None:
        self.series = series

    async def query_range(self, query: str, start: float, end: float, step: float) -> RangeResult:
        return RangeResult(query, [self.series[query.split("{")[0]]])


async def _fresh_at(tmp_path: Path, lump_share: float) -> tuple[float | None, float]:
    lat, req = _counters(900, lump_share, 3)
    named = {"lat": Series({"__name__": "lat", "model": "ranker", "version": "1"}, lat.timestamps, lat.values),
             "req": Series({"__name__": "req", "model": "ranker", "version": "1"}, req.timestamps, req.values)}
    journal = Journal(tmp_path / f"journal-{lump_share}.db")
    try:
        async def emit(signal: object) -> None:
            raise AssertionError("nothing fires here")

        async def offload(fn: Any, *args: Any) -> Any:
            return fn(*args)

        poller = Poller(_ByName(named), journal, Metrics(), detector_registry(), emit, offload,  # type: ignore[arg-type]
                        incremental_range_queries=False)
        poller.sync(load_policies_text(POLICY, "test", action_registry(), detector_registry()))
        now = lat.timestamps[-1]
        for group in list(poller.groups.values()):
            await poller.poll_group(group, now)
        latest = next(w for g in poller.groups.values() for w in g.watches).latest
        assert latest is not None
        return latest.fresh_at, now
    finally:
        journal.close()


async def test_a_cycle_of_only_blind_rows_is_no_sight_of_the_target(tmp_path: Path) -> None:
    """Through a real poll cycle: the stalling bulk's cycle leaves the governed rule's evidence
    where it was (none yet), the calm bulk's cycle is sight now."""
    blind, _ = await _fresh_at(tmp_path, 0.2)
    assert blind is None
    calm, now = await _fresh_at(tmp_path, 0.0)
    assert calm == now
