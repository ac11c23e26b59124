"""The fleet bench/bench_shard_delays.py serves to real `tailguard run` replicas, and the replay it
compares them with: per target, requests per second from the operating curve's own generators
(evaluation/operating_curve/arrivals.py: the seeded rig-like run with the reference defect from its
onset, and before it the healthy history at half budget), scraped every SCRAPE seconds into a
histogram's cumulative bucket at the line and its count; a loopback fake Prometheus answers
query_range on them as Prometheus evaluates a range (each grid point: the newest scrape at or before
it, none after the wall clock); and the live detector's `detect_many` replayed on exactly those
answers at every scrape (what the operating curve's replay does, at the poll interval).

Times: `onset` is a target's defect onset (unix seconds, a multiple of SCRAPE); column c of its
per-second arrays spans onset - HISTORY + c .. + 1."""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np
from aiohttp import web
from numpy.typing import NDArray

from core.detection import Detection
from core.query import Series
from detectors.sequential.thresholds import STORE
from detectors.tail_excess import TailExcessDetector, TailExcessParams
from evaluation.operating_curve.arrivals import Fault, poisson_chunk, seeded_run
from evaluation.operating_curve.traffic import Traffic

SCRAPE = 5.0  # Prometheus' scrape interval and the policies' poll interval (the reference setup)
LINE_MS = 500.0
DEFECT = Fault(0.005, 900)  # the reference defect: 0.5% of requests at 900 ms
HEALTHY = Fault(0.0005, 900)  # half budget: the history before the onset (runs.history's case)
TRAFFIC = Traffic(40.0)
HISTORY = 2400  # seconds of healthy history before the onset (the lookback is 900 s at 40 req/s)
BASE_REQUESTS = 5_000_000.0  # the counters' value at the history's start: a version long in service
BUCKET, COUNT = "tg_request_duration_ms_bucket", "tg_request_duration_ms_count"


@dataclass(frozen=True)
class Target:
    """One model's arrivals: cumulative requests and requests at or under the line, per second."""

    model: str
    seed: int
    onset: float
    requests: NDArray[np.float64]  # cumulative, [HISTORY + horizon + 1]: index c = end of column c - 1
    below: NDArray[np.float64]

    def counters(self, t: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(count, bucket at the line) as Prometheus answers at times `t`: the newest scrape at or
        before each (scrapes on multiples of SCRAPE), clamped to the data's span."""
        scraped = np.floor(t / SCRAPE + 1e-9) * SCRAPE
        c = np.clip(np.rint(scraped - (self.onset - HISTORY)).astype(np.int64), 0, self.requests.size - 1)
        return self.requests[c], self.below[c]


def make_target(model: str, seed: int, onset: float, horizon: float) -> Target:
    """The seeded run with the reference defect from `onset` (arrivals.seeded_run, 1 s steps), after
    HISTORY s of healthy Poisson traffic at half budget (its own seed, as runs.history draws it)."""
    assert onset % SCRAPE == 0
    before = poisson_chunk(np.random.default_rng(50_000 + seed), np.full((1, HISTORY), TRAFFIC.mean), HEALTHY,
                           LINE_MS)
    after = seeded_run(seed, TRAFFIC, DEFECT, horizon, LINE_MS)
    req = np.concatenate([before.requests[0], after.requests[0]])
    above = np.concatenate([before.above[0], after.above[0]])
    cum_req = BASE_REQUESTS + np.concatenate([[0.0], np.cumsum(req)])
    cum_below = BASE_REQUESTS + np.concatenate([[0.0], np.cumsum(req - above)])
    return Target(model, seed, onset, cum_req, cum_below)


def labels(model: str, bucket: bool) -> dict[str, str]:
    base = {"__name__": BUCKET if bucket else COUNT, "model": model, "version": "1"}
    return {**base, "le": "500"} if bucket else base


def grid(start: float, end: float, step: float) -> NDArray[np.float64]:
    """Prometheus' evaluation times of a range query: start, start + step, ... up to end."""
    return start + step * np.arange(int(math.floor((end - start) / step + 1e-9)) + 1)


class Poll(NamedTuple):
    """One range query a replica asked."""

    model: str
    start: float
    end: float
    wall: float  # when it was answered
    newest: float  # the newest grid point answered (nan: none): its phase after a scrape is the grid's


@dataclass
class FakePrometheus:
    """query_range over the targets (the query names its model: `$model` rendered per target), the
    wall clock bounding what has been scraped; every query's (model, end) recorded; and the notify
    receiver (/hook) the policies post to."""

    targets: dict[str, Target]
    clock: Callable[[], float] = time.time
    polls: list[Poll] = field(default_factory=list)
    hooks: list[tuple[float, dict[str, object]]] = field(default_factory=list)

    def answer(self, query: str, start: float, end: float, step: float) -> list[dict[str, object]]:
        found = re.search(r'model="([^"]+)"', query)
        target = self.targets.get(found.group(1)) if found else None
        if target is None:
            return []
        now = self.clock()
        t = grid(start, end, step)
        t = t[t <= now + 1.0]  # end is rounded to the second by the client: never a scrape not yet taken
        count, below = target.counters(np.minimum(t, now))
        bucket = "_bucket" in query
        self.polls.append(Poll(target.model, start, end, now, float(t[-1]) if t.size else math.nan))
        values = below if bucket else count
        return [{"metric": labels(target.model, bucket),
                 "values": [[round(float(a), 3), repr(float(v))] for a, v in zip(t, values)]}]

    def app(self) -> web.Application:
        async def query_range(request: web.Request) -> web.Response:
            form = await request.post()
            arg = {k: str(request.query.get(k) or form.get(k) or "") for k in ("query", "start", "end", "step")}
            result = self.answer(arg["query"], float(arg["start"]), float(arg["end"]), float(arg["step"].rstrip("s")))
            return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

        async def query(request: web.Request) -> web.Response:
            return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})

        async def hook(request: web.Request) -> web.Response:
            self.hooks.append((time.time(), await request.json()))
            return web.json_response({"ok": True})

        async def ready(request: web.Request) -> web.Response:
            return web.Response(text="Prometheus Server is Ready.\n")

        app = web.Application()
        app.router.add_route("*", "/api/v1/query_range", query_range)
        app.router.add_route("*", "/api/v1/query", query)
        app.router.add_post("/hook", hook)
        app.router.add_get("/-/ready", ready)
        return app


def _series(model: str, answer: list[dict[str, object]]) -> Series:
    item = answer[0]
    values = item["values"]
    assert isinstance(values, list)
    return Series(dict(item["metric"]), tuple(float(a) for a, _ in values),  # type: ignore[call-overload]
                  tuple(float(v) for _, v in values))


def replay(target: Target, params: TailExcessParams, first_poll: float, last_poll: float) -> float:
    """Seconds from the onset to the first poll at which the live detector fires on `target`, polled
    on the scrape grid (each poll right at a scrape, reading its lookback as the poller asks for it:
    now - lookback .. now, step SCRAPE) from `first_poll` to `last_poll`; inf when it never does.
    The first poll's traffic cell is derived before the next (the daemon derives it in the
    background within seconds, long before an onset)."""
    fake = FakePrometheus({target.model: target}, clock=lambda: math.inf)
    detector = TailExcessDetector(params)
    now = first_poll
    while now <= last_poll:
        start = now - float(detector.lookback_seconds)
        primary = _series(target.model, fake.answer(f'{BUCKET}{{model="{target.model}"}}', start, now, SCRAPE))
        companion = _series(target.model, fake.answer(f'{COUNT}{{model="{target.model}"}}', start, now, SCRAPE))
        found: list[Detection] = detector.detect_many([primary], now, [companion])
        if now == first_poll:
            STORE.wait()
        if found[0].fired:
            return now - target.onset
        now += SCRAPE
    return math.inf
