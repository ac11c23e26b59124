"""The poller never asks Prometheus for a point past its clock. The client rounds a range's end to the
second; rounded up, the histogram's `_bucket` and `_count` (two queries, answered one after the other)
were evaluated at a time a scrape could land between their answers: a new count over an old bucket read
a whole step's requests as slow, and a healthy model fired (bench/bench_shard_delays.py, 64 models:
34 fired before their defect's onset, "~200 requests above 500 in 200 requests")."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from core.query import Series
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import RangeResult
from daemon.storage.journal import Journal
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.poller import Poller
from policies.loader import load_policies_text

SCRAPE, RATE = 5.0, 40.0
POLICY = """
name: hist
target: {model: m}
triggers:
  - detector:
      type: tail_excess
      query: h_ms_bucket{model="$model", le="500"}
      companionQuery: h_ms_count{model="$model"}
      interval: 5s
      params: {line: 500, line_unit: ms, evidence: histogram}
actions:
  - type: notify
    url: http://127.0.0.1:9/hook
"""


class _ScrapedHistogram:
    """Prometheus over a healthy histogram (every request under the line) scraped every 5 s: a grid
    point holds the newest scrape at or before it that had happened when the query was answered. The
    client's rounding of start and end to the second is applied; each answer moves the clock on by
    `per_answer`, so a scrape can land between a cycle's two queries. A scrape is seen once it has
    been ingested, `ingest` after its stamp (the time it began)."""

    def __init__(self, now: float, per_answer: float, ingest: float = 0.0) -> None:
        self.now, self.per_answer, self.ingest = now, per_answer, ingest
        self.asked: list[tuple[float, float]] = []

    async def query_range(self, query: str, start: float, end: float, step: float) -> RangeResult:
        self.asked.append((start, end))
        start, end = round(start), round(end)
        t = [start + step * k for k in range(int((end - start) // step) + 1)]
        scraped = [math.floor(min(x, self.now - self.ingest) / SCRAPE) * SCRAPE for x in t]
        self.now += self.per_answer
        labels = {"model": "m", "version": "1", **({"le": "500"} if "_bucket" in query else {})}
        return RangeResult(query, [Series(labels, tuple(t), tuple(RATE * s for s in scraped))])


async def _healthy_cycles(tmp_path: Path, prom: _ScrapedHistogram, incremental: bool, phase: float) -> None:
    """Twelve poll cycles, each `phase` s past a scrape, the count answered 0.15 s after the bucket:
    a healthy histogram must not fire, and each cycle's range ends no later than its clock."""
    fired: list[Any] = []

    async def emit(signal: Any) -> None:
        fired.append(signal)

    async def offload(fn: Any, *args: Any) -> Any:
        return fn(*args)

    journal = Journal(tmp_path / "j.db")
    try:
        poller = Poller(prom, journal, Metrics(), detector_registry(), emit, offload,  # type: ignore[arg-type]
                        incremental_range_queries=incremental)
        poller.sync(load_policies_text(POLICY, "p.yaml", action_registry(), detector_registry()))
        (group,) = poller.groups.values()
        for cycle in range(12):
            now = 1_800_000_000.0 + SCRAPE * cycle + phase
            prom.now, prom.per_answer = now + 0.05, 0.15
            await poller.poll_group(group, now)
            assert all(round(end) <= now for _, end in prom.asked), prom.asked  # as the client sends it
        assert fired == [] and group.watches[0].latest is not None
    finally:
        journal.close()


@pytest.mark.parametrize("incremental", [True, False])
async def test_a_healthy_histogram_never_fires_when_a_scrape_lands_between_the_bucket_and_the_count(
        tmp_path: Path, incremental: bool) -> None:
    """Polls 4.9 s past a scrape: the client would round their end up to the next scrape, which lands
    between the bucket's answer and the count's."""
    await _healthy_cycles(tmp_path, _ScrapedHistogram(1_800_000_000.0, 0.0), incremental, 4.9)


@pytest.mark.parametrize("incremental", [True, False])
async def test_a_healthy_histogram_never_fires_when_a_scrape_is_ingested_between_the_bucket_and_the_count(
        tmp_path: Path, incremental: bool) -> None:
    """A scrape stamped at or before the range's end but still being read when the bucket is answered
    (its samples committed 0.1 s after its stamp) is in the count's answer and not the bucket's: a
    whole step's requests read as slow. Polls 0.02 s after a scrape began: the bucket answered at
    0.07 s (the scrape not yet in), the count at 0.22 s (in). The range ends a second (INGESTING)
    before the clock, so such a scrape is in neither answer until both have it."""
    await _healthy_cycles(tmp_path, _ScrapedHistogram(1_800_000_000.0, 0.0, ingest=0.1), incremental, 0.02)


async def test_polls_stay_on_the_grid_of_the_range_caches_full_query_however_late_the_loop_ticks(
        tmp_path: Path) -> None:
    """The poll loop wakes every 0.5 s plus its own work, so a group falls due a little after its time.
    Each cycle used to start from that late wake-up (next due = now + interval): the polls drifted
    off the grid the range cache keeps from its last full query (one in 60 cycles), and once a poll's
    end had drifted past a scrape beyond that grid the newest point was a step old: the detector read
    the scrape before the newest for minutes (bench/bench_shard_delays.py: one leader, 64 models,
    every detection 5.3-5.7 s after the replay's instead of within the poll's phase). Now every
    range ends on the whole seconds of the first: the newest point is the whole second at least one
    second (INGESTING) before the poll."""
    start = 1_800_000_000.3
    prom = _ScrapedHistogram(start, 0.0)

    async def emit(signal: Any) -> None:
        raise AssertionError("a healthy histogram fires")

    async def offload(fn: Any, *args: Any) -> Any:
        return fn(*args)

    journal = Journal(tmp_path / "j.db")
    try:
        poller = Poller(prom, journal, Metrics(), detector_registry(), emit, offload)  # type: ignore[arg-type]
        poller.sync(load_policies_text(POLICY, "p.yaml", action_registry(), detector_registry()))
        (group,) = poller.groups.values()
        polled: list[float] = []
        for tick in range(1_200):  # ten minutes of wake-ups, 0.53 s apart, as Poller.run checks them
            now = start + 0.53 * tick
            if group.next_due <= now:
                prom.now = now
                await poller.poll_group(group, now)
                polled.append(now)
        ends = [end for _, end in prom.asked]
        assert len(polled) > 100 and {(end - ends[0]) % SCRAPE for end in ends} == {0.0}
        assert all(1 <= now - end < 2 for now, end in zip(polled, ends[::2]))
    finally:
        journal.close()
