"""Incremental range queries: the lookback window of each range query is kept in memory and each
poll cycle asks Prometheus only for the steps since the last one, so a cycle parses a step's worth
of points per series instead of the whole window (120 points at 10 min / 5 s)."""
from __future__ import annotations

import asyncio
import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Mapping, Protocol

import structlog

from core.query import Series
from daemon.sources.prometheus import RangeResult

log = structlog.get_logger("tailguard.range_cache")

TOLERANCE_SECONDS = 1e-3
"""Prometheus' timestamps are milliseconds; two stamps closer than this are one grid point."""


class RangeQueries(Protocol):
    """What the cache wraps: `PrometheusClient.query_range`."""

    async def query_range(self, promql: str, start: float, end: float, step_seconds: float) -> RangeResult: ...


# (query, step seconds, lookback seconds): one cached window each.
WindowKey = tuple[str, float, float]
# A series' identity inside one query's answer: all its labels (the metric name included), sorted.
# A tuple of strings, which the cyclic GC stops tracking, where a frozenset per series stayed
# in every full collection; equal for the same labels as their frozenset is.
SeriesKey = tuple[tuple[str, str], ...]


def _key_of(labels: Mapping[str, str]) -> SeriesKey:
    return tuple(sorted(labels.items()))


@dataclass
class _Window:
    """The cached lookback of one (query, step, lookback). Its series are columns of parallel
    lists, in the order first seen, where one object per series was one more for the cyclic GC to
    walk in every full collection, and the points tuples are handed out as they are (a cycle
    builds new ones)."""

    lookback: float
    step: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one fetch-and-merge at a time per window
    index: dict[SeriesKey, int] = field(default_factory=dict)  # each series' position in the lists
    keys: list[SeriesKey] = field(default_factory=list)
    labels: list[Mapping[str, str]] = field(default_factory=list)
    timestamps: list[tuple[float, ...]] = field(default_factory=list)
    values: list[tuple[float, ...]] = field(default_factory=list)
    last_t: float | None = None  # the newest grid point answered; None: the next call is a full query
    cycles: int = 0  # calls answered since the last full query, that one included
    used_at: float = -math.inf  # the `end` of the last call, for sweeping windows no group asks for

    def reset(self) -> None:
        self.index.clear()
        self.keys.clear()
        self.labels.clear()
        self.timestamps.clear()
        self.values.clear()
        self.last_t = None
        self.cycles = 0

    def add(self, key: SeriesKey, labels: Mapping[str, str]) -> int:
        """A new series, without points yet, last; its position."""
        at = self.index[key] = len(self.keys)
        self.keys.append(key)
        self.labels.append(labels)
        self.timestamps.append(())
        self.values.append(())
        return at

    def drop(self, gone: list[int]) -> None:
        """Forgets the series at the positions `gone` (ascending); the rest keep their order."""
        keep = sorted(set(range(len(self.keys))).difference(gone))
        self.keys = [self.keys[at] for at in keep]
        self.labels = [self.labels[at] for at in keep]
        self.timestamps = [self.timestamps[at] for at in keep]
        self.values = [self.values[at] for at in keep]
        self.index = {key: at for at, key in enumerate(self.keys)}


class RangeCache:
    """`query_range` with the same arguments and answer as `PrometheusClient.query_range`, asking
    Prometheus for the whole `[start, end]` only when it must:

    - the first call of a (query, step, lookback), after an error, every `full_refresh_cycles`
      calls (to heal whatever an increment may have missed), when the caller comes back after more
      than a lookback (late), when its clock went back, or when the increment's points are off the
      cached grid;
    - otherwise from the newest cached grid point (`overlap_steps` grid points before the first new
      one) to `end`, at the same step: Prometheus evaluates a range at `start + k * step`, so
      starting on a cached point keeps every timestamp on the grid of the last full query. The
      re-asked overlap replaces what was cached for it: a point evaluated at the edge of `now`
      may have missed a scrape that was still being ingested, and a full query would see it later.

    Points older than `start` (in whole seconds, as the client sends it) are dropped and series with no point left are forgotten, so memory
    is at most (lookback / step + 1) points per series of each live query; windows no caller has
    asked for in over a lookback are dropped. Errors are never cached: one clears the window and is
    returned as it came. The answer is a new `RangeResult`; its series are in the order first seen
    (the full query's order, new series after).

    The grid stays whole only where the client can express it: `PrometheusClient` sends whole
    seconds, so a step that is not a whole number of seconds is always a full query.
    """

    def __init__(self, client: RangeQueries, full_refresh_cycles: int = 60, overlap_steps: int = 1) -> None:
        """Args:
            client: answers the range queries (a `PrometheusClient`).
            full_refresh_cycles: calls per window between full queries (1: every call is full).
            overlap_steps: cached grid points re-asked by each increment (0: only new ones).
        """
        if full_refresh_cycles < 1:
            raise ValueError("full_refresh_cycles must be at least 1")
        if overlap_steps < 0:
            raise ValueError("overlap_steps must not be negative")
        self._client = client
        self.full_refresh_cycles = full_refresh_cycles
        self.overlap_steps = overlap_steps
        self._windows: dict[WindowKey, _Window] = {}
        self._shared_stamps: dict[float, tuple[float, ...]] = {}  # per step: the last whole grid (`_update`)
        self.full_queries = 0
        self.incremental_queries = 0

    def clear(self) -> None:
        """Forget every window: the next call of each query is a full query."""
        for window in self._windows.values():
            window.reset()

    def held_points(self) -> int:
        """Points held over all windows (each point is a timestamp and a value)."""
        return sum(len(ts) for w in self._windows.values() for ts in w.timestamps)

    async def query_range(self, promql: str, start: float, end: float, step_seconds: float) -> RangeResult:
        """The range `[start, end]` of `promql` at `step_seconds`, as the client would answer it."""
        lookback = end - start
        key = (promql, float(step_seconds), lookback)
        self._sweep(end)
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window(lookback, float(step_seconds))
        async with window.lock:
            window.used_at = end
            try:
                return await self._answer(window, promql, start, end)
            except BaseException:  # cancelled or a client that raises: what is cached may be half-merged
                window.reset()
                raise

    async def _answer(self, window: _Window, promql: str, start: float, end: float) -> RangeResult:
        since = self._increment_start(window, end)
        if since is not None:
            if since > end + TOLERANCE_SECONDS:  # early: no new grid point yet
                window.cycles += 1
                return RangeResult(promql, self._update(window, [], None, start))
            self.incremental_queries += 1
            part = await self._client.query_range(promql, since, end, window.step)
            if part.error is not None:
                window.reset()
                return part
            if self._on_grid(part.series, since, window.step):
                window.cycles += 1
                return RangeResult(promql, self._update(window, part.series, since, start))
            log.warning("range increment off the cached grid; asking for the whole range", query=promql,
                        since=since, step_seconds=window.step)
        self.full_queries += 1
        window.reset()
        full = await self._client.query_range(promql, start, end, window.step)
        if full.error is not None:
            return full
        window.cycles = 1
        return RangeResult(promql, self._update(window, full.series, None, start))

    def _increment_start(self, window: _Window, end: float) -> float | None:
        """Where the increment starts, on the cached grid; None where a full query is due."""
        last = window.last_t
        if (last is None or window.cycles >= self.full_refresh_cycles or not window.step.is_integer()
                or end < last - TOLERANCE_SECONDS or end - last > window.lookback):
            return None
        return last + window.step * (1 - self.overlap_steps)

    @staticmethod
    def _on_grid(series: list[Series], since: float, step: float) -> bool:
        """Whether an increment's points are on the cached grid (one point per series tells: a
        range answer's points are `start + k * step`)."""
        for s in series:
            if s.timestamps:
                k = (s.timestamps[0] - since) / step
                if abs(k - round(k)) * step > TOLERANCE_SECONDS:
                    return False
        return True

    def _update(self, window: _Window, answer: list[Series], since: float | None, start: float) -> list[Series]:
        """Takes `answer` (from `since` on; None: nothing cached is replaced) into the window in
        place of what was cached from `since` on, drops points before `start` (in whole seconds, as
        the client sends it: a full query's first point) and series left with none; returns the
        window as Series.

        Series with a point at every step share one timestamps tuple per step (nothing to build,
        and `align` converts it once): on one grid without a gap, equal length, first and last
        stamps are equal stamps. Consecutive series nearly always share both their cached and
        their new timestamps tuple: the plan of the one before is reused without a lookup."""
        window.last_t, new = _take_in(window, answer)
        cuts = _Cuts(old_cut=round(start) - TOLERANCE_SECONDS,
                     new_cut=since - TOLERANCE_SECONDS if since is not None else math.inf,
                     step=window.step, shared=self._shared_stamps.get(window.step, ()))
        out, gone = [], []
        stamps_of, values_of = window.timestamps, window.values
        last: _Plan | None = None
        for at, (labels, ts, s) in enumerate(zip(window.labels, stamps_of, new)):
            add_ts, add_vs = (tuple(s.timestamps), tuple(s.values)) if s is not None else ((), ())
            if last is None or ts is not last[0] or add_ts is not last[1]:
                last = (ts, add_ts, *cuts.plan(ts, add_ts))
            i, j, stamps = last[2], last[3], last[4]
            if stamps is None:
                gone.append(at)
                continue
            if i or j < len(ts) or add_ts:
                stamps_of[at] = stamps
                values_of[at] = values_of[at][i:j] + add_vs
            out.append(Series(labels, stamps_of[at], values_of[at]))
        if gone:
            window.drop(gone)
        self._shared_stamps[window.step] = cuts.shared
        return out

    def _sweep(self, now: float) -> None:
        """Drops windows no caller asked for in over a lookback: their points are all too old to
        answer from, and their query may be gone with a policy reload."""
        stale = [k for k, w in self._windows.items()
                 if now - w.used_at > w.lookback + w.step and not w.lock.locked()]
        for key in stale:
            del self._windows[key]
        if stale:
            steps = {w.step for w in self._windows.values()}
            self._shared_stamps = {k: v for k, v in self._shared_stamps.items() if k in steps}


def _take_in(window: _Window, answer: list[Series]) -> tuple[float | None, list[Series | None]]:
    """Finds each series of `answer` among the window's (new series added last); returns the
    window's newest grid point and, per cached position, its series of `answer` (None: none).

    An answer lists its series in the same order every time (Prometheus sorts them), so each is
    first compared with the cached series in its position: equal labels are the same series,
    found without building its key (most of this loop's cost when built per series)."""
    newest = window.last_t
    cached = window.labels
    known = len(cached)
    new: list[Series | None] = [None] * known
    for pos, s in enumerate(answer):
        if not s.timestamps:
            continue
        if pos < known and cached[pos] == s.labels:
            at = pos
        else:
            key = _key_of(s.labels)
            found = window.index.get(key)
            if found is None:
                found = window.add(key, s.labels)
                new.append(None)
            at = found
        new[at] = s
        if newest is None or s.timestamps[-1] > newest:
            newest = s.timestamps[-1]
    return newest, new


# A plan of `_Cuts`: the cached and the new timestamps it is for (held, so that their ids stay
# theirs while the plan is kept), the cached points kept [i, j), and the joined timestamps (None:
# no point left).
_Plan = tuple[tuple[float, ...], tuple[float, ...], int, int, tuple[float, ...] | None]


@dataclass
class _Cuts:
    """One `_update`'s cut and join of timestamps. The series of one grid share their cached
    timestamps tuple and (from `PrometheusClient`) their new one, so the bisects and comparisons
    run once per pair of tuples instead of once per series."""

    old_cut: float  # points before it are dropped
    new_cut: float  # cached points from it on are replaced by the new ones
    step: float
    shared: tuple[float, ...]  # the longest whole grid so far: series equal to it share it
    plans: dict[tuple[int, int], _Plan] = field(default_factory=dict)

    def plan(self, ts: tuple[float, ...], add_ts: tuple[float, ...]) -> tuple[int, int, tuple[float, ...] | None]:
        """The cached points kept, [i, j), and the timestamps once `add_ts` is appended (None
        where no point is left; `ts` itself where nothing changes)."""
        hit = self.plans.get((id(ts), id(add_ts)))
        if hit is None:
            hit = self.plans[id(ts), id(add_ts)] = (ts, add_ts, *self._join(ts, add_ts))
        return hit[2], hit[3], hit[4]

    def _join(self, ts: tuple[float, ...], add_ts: tuple[float, ...]) -> tuple[int, int, tuple[float, ...] | None]:
        i = bisect_left(ts, self.old_cut) if ts and ts[0] < self.old_cut else 0
        j = bisect_left(ts, self.new_cut, i) if ts and ts[-1] >= self.new_cut else len(ts)
        n = j - i + len(add_ts)
        if n == 0:
            return i, j, None
        if not (i or j < len(ts) or add_ts):
            return i, j, ts
        first = ts[i] if j > i else add_ts[0]
        last = add_ts[-1] if add_ts else ts[j - 1]
        shared = self.shared
        if n == len(shared) and first == shared[0] and last == shared[-1]:
            return i, j, shared
        joined = ts[i:j] + add_ts
        if ((n > len(shared) or (n == len(shared) and last > shared[-1]))
                and abs(last - first - (n - 1) * self.step) < TOLERANCE_SECONDS):
            self.shared = joined
        return i, j, joined
