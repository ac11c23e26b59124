"""RangeCache: answers assembled from increments equal what a full range query answers at the same
moment, cycle after cycle, through new and vanishing series, errors, late and early pollers, and
scrapes ingested late; memory stays within the lookback.

The fake evaluates range queries as Prometheus does (the grid `start + k * step <= end` from the
whole seconds PrometheusClient sends; each point the newest sample at or before it, within a short
staleness), over scrapes that become visible when they are ingested."""
from __future__ import annotations

import asyncio
import math
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import AsyncIterator, Mapping, Sequence

import pytest
from aiohttp import web

from core.query import Series
from daemon.sources.prometheus import PrometheusClient, RangeResult
from daemon.sources.range_cache import RangeCache

T0 = 1_767_225_600.0
STEP = 5.0
LOOKBACK = 600.0
QUERY = "nv_inference_request_success"


@dataclass
class Scrape:
    t: float
    value: float
    ingested: float  # when a query can first see it


@dataclass
class FakePrometheus:
    """Range queries over scrapes, as Prometheus evaluates them (see the module docstring)."""

    staleness: float = 12.0  # short, so a series that stops being scraped vanishes within 3 steps
    now: float = 0.0
    history: dict[frozenset[tuple[str, str]], tuple[dict[str, str], list[Scrape]]] = field(default_factory=dict)
    calls: list[tuple[float, float, float]] = field(default_factory=list)
    fail: bool = False
    raise_error: bool = False
    shift: float = 0.0  # added to every answered timestamp: a server off the asked grid

    def scrape(self, labels: Mapping[str, str], t: float, value: float, delay: float = 0.0) -> None:
        key = frozenset(labels.items())
        self.history.setdefault(key, (dict(labels), []))[1].append(Scrape(t, value, t + delay))

    def evaluate(self, start: float, end: float, step: float) -> list[Series]:
        grid = []
        k = 0
        while start + k * step <= end:
            grid.append(start + k * step)
            k += 1
        out = []
        for labels, scrapes in self.history.values():
            seen = [s for s in scrapes if s.ingested <= self.now]
            stamps = [s.t for s in seen]
            points = []
            for t in grid:
                i = bisect_right(stamps, t) - 1
                if i >= 0 and t - stamps[i] < self.staleness:
                    points.append((t + self.shift, seen[i].value))
            if points:
                out.append(Series(dict(labels), tuple(p[0] for p in points), tuple(p[1] for p in points)))
        return out

    async def query_range(self, promql: str, start: float, end: float, step_seconds: float) -> RangeResult:
        self.calls.append((start, end, step_seconds))
        await asyncio.sleep(0)  # a real fetch yields to the loop
        if self.raise_error:
            raise ConnectionError("connection reset")
        if self.fail:
            return RangeResult(promql, error="PrometheusApiClientException: HTTP Status Code 503")
        return RangeResult(promql, self.evaluate(round(start), round(end), step_seconds))


def as_map(series: Sequence[Series]) -> dict[frozenset[tuple[str, str]], tuple[tuple[float, ...], tuple[str, ...]]]:
    """Series by identity, values as text so that NaN equals NaN."""
    return {frozenset(s.labels.items()): (tuple(s.timestamps), tuple(repr(v) for v in s.values)) for s in series}


def full_answer(prom: FakePrometheus, now: float, lookback: float = LOOKBACK, step: float = STEP) -> list[Series]:
    return prom.evaluate(round(now - lookback), round(now), step)


def answer_on_grid(prom: FakePrometheus, now: float, anchor: float) -> list[Series]:
    """A full query's answer evaluated on the grid `anchor + k * STEP` instead of its own."""
    first = anchor + math.ceil((round(now - LOOKBACK) - anchor) / STEP) * STEP
    return prom.evaluate(first, round(now), STEP)


class Fleet:
    """Pods scraped every 5 s at their own offsets: counters that grow, some NaN, resets, missed
    scrapes (three in a row leave a gap in the answer); pods born and gone over time."""

    def __init__(self, prom: FakePrometheus, seed: int = 1) -> None:
        self.prom = prom
        self.rng = random.Random(seed)
        self.counters: dict[int, float] = {}
        self.missing: dict[int, int] = {}  # scrapes still to miss, per pod
        self.scraped_to = T0 - LOOKBACK - 60

    def alive(self, pod: int, t: float) -> bool:
        born = T0 - LOOKBACK - 60 if pod < 20 else T0 + 40 * (pod - 19)  # a new pod every 8 cycles
        gone = T0 - LOOKBACK + 100 * (pod + 1) if pod % 5 == 0 else math.inf  # every fifth pod goes away
        return born <= t < gone

    def advance(self, to: float, delay: float = 0.0) -> None:
        """Scrapes up to `to`: each pod at whole seconds plus its offset."""
        t = self.scraped_to
        while t + 1 <= to:
            t += 1
            for pod in range(40):
                if (t - pod) % STEP == 0 and self.alive(pod, t):
                    if self.missing.get(pod, 0) or self.rng.random() < 0.01:
                        self.missing[pod] = (self.missing.get(pod) or 3) - 1
                        continue
                    c = self.counters.get(pod, 0.0) + self.rng.randint(0, 50)
                    if self.rng.random() < 0.01:
                        c = 0.0  # a restart
                    self.counters[pod] = c
                    value = math.nan if self.rng.random() < 0.02 else c
                    self.prom.scrape({"__name__": QUERY, "pod": f"p{pod}"}, t + 0.25 * (pod % 4), value, delay)
        self.scraped_to = t


async def test_increments_equal_full_queries_over_many_cycles() -> None:
    """60 cycles, 0-0.45 s late each: every answer equals the full query's, while series are born
    and vanish; after the first, each call asks only from the newest cached point to now."""
    prom = FakePrometheus()
    fleet = Fleet(prom)
    cache = RangeCache(prom, full_refresh_cycles=1000)
    rng = random.Random(7)
    seen_born = seen_gone = False
    for k in range(60):
        now = T0 + k * STEP + rng.uniform(0, 0.45)
        fleet.advance(now)
        prom.now = now
        got = await cache.query_range(QUERY, now - LOOKBACK, now, STEP)
        assert got.error is None
        assert as_map(got.series) == as_map(full_answer(prom, now)), f"cycle {k}"
        names = {s.labels["pod"] for s in got.series}
        seen_born |= "p25" in names
        seen_gone |= k > 10 and "p0" not in names
        start, end, _ = prom.calls[-1]
        if k > 0:
            assert end - start == pytest.approx(round(now) - round(now - STEP), abs=1.0)  # one step, overlap
    assert seen_born and seen_gone
    assert (cache.full_queries, cache.incremental_queries) == (1, 59)


@dataclass
class Shuffling:
    """A FakePrometheus whose answers list their series in a random order each call."""

    prom: FakePrometheus
    rng: random.Random

    async def query_range(self, promql: str, start: float, end: float, step_seconds: float) -> RangeResult:
        got = await self.prom.query_range(promql, start, end, step_seconds)
        self.rng.shuffle(got.series)
        return got


@pytest.mark.parametrize("shuffle", [False, True])
async def test_series_come_in_the_order_first_seen_and_keep_their_labels(shuffle: bool) -> None:
    """The answer lists the series in the order the cache first saw them (new ones last, gone
    ones out, one that comes back last again), whatever order Prometheus answers in, each with
    the labels mapping it was first seen with (what the poller's memos key on)."""
    prom = FakePrometheus()
    fleet = Fleet(prom, seed=3)
    client = Shuffling(prom, random.Random(5)) if shuffle else prom
    cache = RangeCache(client, full_refresh_cycles=7)
    order: dict[frozenset[tuple[str, str]], Mapping[str, str]] = {}  # the reference: first seen, in order
    for k in range(50):
        now = T0 + k * STEP
        fleet.advance(now)
        prom.now = now
        got = await cache.query_range(QUERY, now - LOOKBACK, now, STEP)
        assert as_map(got.series) == as_map(full_answer(prom, now)), f"cycle {k}"
        if (cache.full_queries + cache.incremental_queries - 1) % 7 == 0:  # a full query: first seen anew
            order.clear()
        for s in got.series:
            order.setdefault(frozenset(s.labels.items()), s.labels)
        keys = [frozenset(s.labels.items()) for s in got.series]
        assert keys == [key for key in order if key in set(keys)], f"cycle {k}"
        assert all(s.labels is order[key] for s, key in zip(got.series, keys)), f"cycle {k}"
        order = {key: order[key] for key in keys}  # gone series are forgotten


async def test_error_is_returned_not_cached_and_clears_the_window() -> None:
    """An error in between comes back as it came; the next call is a full query again and
    equals the full answer."""
    prom = FakePrometheus()
    fleet = Fleet(prom)
    cache = RangeCache(prom)
    for k in range(8):
        now = T0 + k * STEP
        fleet.advance(now)
        prom.now = now
        prom.fail = k == 4
        got = await cache.query_range(QUERY, now - LOOKBACK, now, STEP)
        if k == 4:
            assert got.error is not None and "503" in got.error and not got.series
            assert cache.held_points() == 0
            continue
        assert as_map(got.series) == as_map(full_answer(prom, now))
    assert [c[0] for c in prom.calls].count(T0 + 5 * STEP - LOOKBACK) == 1  # the one after the error: full
    assert cache.full_queries == 2


async def test_a_raising_client_clears_the_window() -> None:
    """A client that raises: the exception passes through and the next call is a full query."""
    prom = FakePrometheus()
    Fleet(prom).advance(T0 + 10)
    prom.now = T0 + 10
    cache = RangeCache(prom)
    await cache.query_range(QUERY, T0 - LOOKBACK, T0, STEP)
    prom.raise_error = True
    with pytest.raises(ConnectionError):
        await cache.query_range(QUERY, T0 + STEP - LOOKBACK, T0 + STEP, STEP)
    prom.raise_error = False
    got = await cache.query_range(QUERY, T0 + 2 * STEP - LOOKBACK, T0 + 2 * STEP, STEP)
    assert prom.calls[-1][:2] == (T0 + 2 * STEP - LOOKBACK, T0 + 2 * STEP)
    assert as_map(got.series) == as_map(full_answer(prom, T0 + 2 * STEP))


async def test_a_poller_late_by_more_than_the_lookback_asks_for_everything() -> None:
    """Back after 15 minutes (longer than the 10-minute lookback): a full query, nothing stale kept."""
    prom = FakePrometheus()
    fleet = Fleet(prom)
    cache = RangeCache(prom)
    for now in (T0, T0 + STEP, T0 + STEP + 900):
        fleet.advance(now)
        prom.now = now
        got = await cache.query_range(QUERY, now - LOOKBACK, now, STEP)
        assert as_map(got.series) == as_map(full_answer(prom, now))
    assert prom.calls[-1][:2] == (T0 + STEP + 900 - LOOKBACK, T0 + STEP + 900)
    assert cache.full_queries == 2


async def test_a_poller_drifting_late_stays_on_the_first_grid() -> None:
    """Cycles late by whole seconds (a full query would start a new grid): the cached points stay
    on the grid of the first full query and equal a full query evaluated on that grid."""
    prom = FakePrometheus()
    fleet = Fleet(prom)
    cache = RangeCache(prom, full_refresh_cycles=1000)
    anchor = round(T0 - LOOKBACK)
    now = T0
    for k in range(30):
        now += STEP + (2.6 if k % 7 == 3 else 0.3)
        fleet.advance(now)
        prom.now = now
        got = await cache.query_range(QUERY, now - LOOKBACK, now, STEP)
        assert as_map(got.series) == as_map(answer_on_grid(prom, now, anchor)), f"cycle {k}"
        assert all((t - anchor) % STEP == 0 for s in got.series for t in s.timestamps)
    assert cache.full_queries == 1


async def test_an_early_poller_and_a_clock_going_back() -> None:
    """Called again a second later, within the same step: the newest point is asked again and the
    answer is the full one on the cached grid (its oldest point dropped). Called with an earlier `now` than the cached
    points: a full query."""
    prom = FakePrometheus()
    fleet = Fleet(prom)
    cache = RangeCache(prom)
    fleet.advance(T0 + 1)
    prom.now = T0 + 1
    first = await cache.query_range(QUERY, T0 - LOOKBACK, T0, STEP)
    again = await cache.query_range(QUERY, T0 + 1 - LOOKBACK, T0 + 1, STEP)
    assert as_map(first.series) == as_map(full_answer(prom, T0))
    assert as_map(again.series) == as_map(answer_on_grid(prom, T0 + 1, T0 - LOOKBACK))
    assert prom.calls[-1][:2] == (T0, T0 + 1)
    assert cache.full_queries == 1
    back = await cache.query_range(QUERY, T0 - 30 - LOOKBACK, T0 - 30, STEP)
    assert cache.full_queries == 2
    assert as_map(back.series) == as_map(full_answer(prom, T0 - 30))


async def test_a_policy_change_of_lookback_or_step_is_a_full_query() -> None:
    """Another lookback or step is another window, first answered by a full query."""
    prom = FakePrometheus()
    fleet = Fleet(prom)
    cache = RangeCache(prom)
    fleet.advance(T0 + STEP)
    prom.now = T0 + STEP
    await cache.query_range(QUERY, T0 - LOOKBACK, T0, STEP)
    got = await cache.query_range(QUERY, T0 + STEP - 300, T0 + STEP, STEP)
    assert as_map(got.series) == as_map(full_answer(prom, T0 + STEP, lookback=300))
    got = await cache.query_range(QUERY, T0 + STEP - LOOKBACK, T0 + STEP, 10.0)
    assert as_map(got.series) == as_map(full_answer(prom, T0 + STEP, step=10.0))
    assert cache.full_queries == 3


async def test_a_full_query_every_full_refresh_cycles() -> None:
    """With full_refresh_cycles=5: calls 1, 6 and 11 ask for the whole lookback."""
    prom = FakePrometheus()
    fleet = Fleet(prom)
    cache = RangeCache(prom, full_refresh_cycles=5)
    fulls = []
    for k in range(12):
        now = T0 + k * STEP
        fleet.advance(now)
        prom.now = now
        before = cache.full_queries
        await cache.query_range(QUERY, now - LOOKBACK, now, STEP)
        if cache.full_queries > before:
            fulls.append(k + 1)
    assert fulls == [1, 6, 11]


async def test_scrapes_ingested_late_are_healed_by_the_overlap() -> None:
    """Scrapes visible 2 s after their timestamp: the point at `now` misses them. Re-asking the
    newest cached point (overlap_steps=1, the default) gives the full answer; without it the
    cache keeps the early values."""
    for overlap, equal in ((1, True), (0, False)):
        prom = FakePrometheus()
        fleet = Fleet(prom)
        cache = RangeCache(prom, overlap_steps=overlap)
        mismatches = 0
        for k in range(20):
            now = T0 + k * STEP + 0.2
            fleet.advance(now + 5, delay=2.0)  # what is ingested by `now` decides
            prom.now = now
            got = await cache.query_range(QUERY, now - LOOKBACK, now, STEP)
            if k > 0:
                # Points older than the newest are final by now; the newest may still change.
                want = full_answer(prom, now)
                newest = round(now)
                trimmed = [Series(s.labels, s.timestamps[:-1], s.values[:-1]) if s.timestamps[-1] == newest else s
                           for s in want]
                mine = [Series(s.labels, s.timestamps[:-1], s.values[:-1]) if s.timestamps[-1] == newest else s
                        for s in got.series]
                mismatches += as_map(mine) != as_map(trimmed)
        assert (mismatches == 0) is equal, (overlap, mismatches)


async def test_an_increment_off_the_grid_falls_back_to_a_full_query() -> None:
    """A server answering off the asked grid (here shifted by 2 s): the cache asks for the whole
    range rather than mixing two grids."""
    prom = FakePrometheus()
    fleet = Fleet(prom)
    cache = RangeCache(prom)
    fleet.advance(T0 + STEP)
    prom.now = T0 + STEP
    await cache.query_range(QUERY, T0 - LOOKBACK, T0, STEP)
    prom.shift = 2.0
    got = await cache.query_range(QUERY, T0 + STEP - LOOKBACK, T0 + STEP, STEP)
    assert cache.full_queries == 2
    assert as_map(got.series) == as_map(full_answer(prom, T0 + STEP))


async def test_a_step_of_a_fraction_of_a_second_is_always_a_full_query() -> None:
    """PrometheusClient sends whole seconds, so a 2.5 s grid cannot be continued: every call is full."""
    prom = FakePrometheus()
    Fleet(prom).advance(T0 + 10)
    prom.now = T0 + 10
    cache = RangeCache(prom)
    for k in range(3):
        await cache.query_range(QUERY, T0 + 2.5 * k - 60, T0 + 2.5 * k, 2.5)
    assert (cache.full_queries, cache.incremental_queries) == (3, 0)


@pytest.mark.slow
async def test_memory_stays_within_lookback_times_series() -> None:
    """300 cycles with a new series every cycle and each living 20 cycles: at most lookback/step+1
    points per series held, series without points forgotten, a query no one asks for dropped."""
    prom = FakePrometheus()
    cache = RangeCache(prom, full_refresh_cycles=1000)
    lookback = 60.0
    per_series = int(lookback / STEP) + 1
    for k in range(300):
        now = T0 + k * STEP
        for pod in range(max(0, k - 20), k + 1):
            prom.scrape({"pod": f"p{pod}"}, now, float(k))
        prom.now = now
        got = await cache.query_range(QUERY, now - lookback, now, STEP)
        assert all(len(s.timestamps) <= per_series for s in got.series)
        live = sum(1 for s in got.series)
        assert live <= 21 + math.ceil(12.0 / STEP) + per_series  # alive + stale tail + still in the window
        assert cache.held_points() <= live * per_series
    assert cache.held_points() > 0
    # Another query only, for longer than the first one's lookback: the first window is dropped.
    for k in range(300, 320):
        now = T0 + k * STEP
        await cache.query_range("other", now - lookback, now, STEP)
    assert cache.held_points() == 0


async def test_concurrent_callers_of_one_query_get_the_full_answer() -> None:
    """Two groups sharing a query, polled at once: both answers equal the full one."""
    prom = FakePrometheus()
    fleet = Fleet(prom)
    cache = RangeCache(prom)
    for k in range(6):
        now = T0 + k * STEP
        fleet.advance(now)
        prom.now = now
        a, b = await asyncio.gather(cache.query_range(QUERY, now - LOOKBACK, now, STEP),
                                    cache.query_range(QUERY, now - LOOKBACK, now, STEP))
        want = as_map(full_answer(prom, now))
        assert as_map(a.series) == want and as_map(b.series) == want


@pytest.fixture
async def prometheus_http() -> AsyncIterator[tuple[FakePrometheus, str]]:
    """The fake behind a loopback /api/v1/query_range, as the real client reads it."""
    prom = FakePrometheus()

    async def query_range(request: web.Request) -> web.Response:
        start, end = float(request.query["start"]), float(request.query["end"])
        step = float(request.query["step"].removesuffix("s"))
        prom.calls.append((start, end, step))
        result = [{"metric": s.labels, "values": [[t, repr(v) if math.isnan(v) else f"{v:g}"]
                                                  for t, v in zip(s.timestamps, s.values)]}
                  for s in prom.evaluate(start, end, step)]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/query_range", query_range)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield prom, f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def test_with_the_real_client_over_http(prometheus_http: tuple[FakePrometheus, str]) -> None:
    """PrometheusClient over loopback HTTP, `now` at fractions of a second: increments stay on the
    grid the client's whole seconds give and equal the client's own full answers."""
    prom, url = prometheus_http
    fleet = Fleet(prom)
    client = PrometheusClient(url)
    cache = RangeCache(client)
    try:
        for k in range(6):
            now = T0 + k * STEP + 0.37
            fleet.advance(now)
            prom.now = now
            got = await cache.query_range(QUERY, now - LOOKBACK, now, STEP)
            full = await client.query_range(QUERY, now - LOOKBACK, now, STEP)
            assert got.error is None and full.error is None
            assert as_map(got.series) == as_map(full.series) and got.series
    finally:
        client.close()
    assert (cache.full_queries, cache.incremental_queries) == (1, 5)
