"""CPU cost of one whole poll cycle of a `tail_excess` trigger at 10,000 series: from the range
query's HTTP response to journaled verdicts, each stage against a baseline measured in the same run
(json.loads of the same response bodies).

The daemon's own pieces run: a Poller with a real SQLite journal in a temporary directory, the
real PrometheusClient (prometheus-api-client, `requests`) against a loopback aiohttp server that
imitates Prometheus' /api/v1/query_range (gzip when asked, as Prometheus does) and answers with
bodies cut from canned counters by the asked `start` and `end`: 10,000 latency counters
(`nv_inference_compute_infer_duration_us`) and their 10,000 request counters
(`nv_inference_request_success`), 120 points at 5 s up to `NOW` and a few steps after it. Most series are
healthy (with rare slow requests below 0.1%), 0.5% carry a tail of 1% of requests at 900 ms for
the last minute, a few restart (counter reset) or miss points (scrape gaps).

The server runs in a subprocess started here and stopped by its PID, so its CPU is not counted:
`time.process_time` is this process (the event loop and its worker threads: HTTP client, JSON,
detector, SQLite), after one warm-up cycle (the journal then holds one row per series, as in steady
state). Two kinds of cycle, each best of REPEATS: a first cycle (the range cache emptied, so both
range queries ask for the whole lookback, as after a start, an error or a full refresh), and a
steady-state cycle one step later than the one before (the range cache asks for the newest cached
point and the new one). Wall time is shown for reference; an increment's wall time includes the
fake server cutting a new body.
The start-up heap is frozen before the warm-up, as `tailguard run` does once started (`--no-freeze`:
not). `--histogram`: the same traffic as a latency histogram instead (the bucket at the line,
`lab_client_request_duration_ms_bucket{le="500"}`, and the count). The thresholds of every traffic
the series carry, in the first and in the steady cycles, are derived once before the measured
cycles (the daemon derives them in a background thread as new traffic appears, once per traffic
cell; their one-time cost is printed, and a cell derived during a measured cycle would count in
its process_time). Prints tables; not a test.
`--led K` (with `--policies N`): only the first K policies are loaded, as on a sharded replica leading
K of the N models whose fleet-wide query names no model: the answer still holds every model's series.
Run: python bench/bench_poll_cycle.py [--quick] [--policies N [--led K]] [--no-cache] [--no-freeze] [--histogram]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, TypeVar

import numpy as np
from aiohttp import web

SRC = Path(os.environ.get("TAILGUARD_SRC", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(SRC))

from lab.ports import LOOPBACK, free_port  # noqa: E402
from lab.process import ManagedProcess  # noqa: E402

POINTS = 120  # 10 min at a 5 s scrape
STEADY_CYCLES = 4  # steady-state cycles measured, one step apart after NOW: data runs that far past it
STEP_SECONDS = 5.0
NOW = 1_767_225_600.0  # the cycle's `now`: the newest sample is at it
LATENCY = "nv_inference_compute_infer_duration_us"
REQUESTS = "nv_inference_request_success"
BUCKET = "lab_client_request_duration_ms_bucket"  # --histogram: the bucket at the line (ms)
TAIL_SHARE = 0.005  # of series: 1% of requests at 900 ms over the last 12 steps (a minute)
BUDGET_CPU_SECONDS = 1.0  # issue 15: a whole cycle at 10,000 series
T = TypeVar("T")


# ---- the data and the fake Prometheus (the server runs in a subprocess) -------------------

@dataclass
class Counters:
    labels: list[dict[str, str]]  # identity labels (no __name__)
    timestamps: np.ndarray
    latency: np.ndarray  # [S x P] cumulative microseconds, NaN where the scrape missed
    requests: np.ndarray  # [S x P] cumulative requests
    tail: np.ndarray  # [S] bool: planted tails
    above: np.ndarray  # [S x P] cumulative requests above the line (a histogram's count minus its bucket)


def make_counters(n_series: int, policies: int, rng: np.random.Generator) -> Counters:
    """Triton-like cumulative counters of one model version per pod (see the module docstring):
    POINTS up to NOW, then STEADY_CYCLES more for the steady-state cycles."""
    ts = NOW - STEP_SECONDS * np.arange(POINTS - 1, -1 - STEADY_CYCLES, -1)
    n_points = ts.size
    d_req = rng.poisson(rng.uniform(5, 60, (n_series, 1)) * STEP_SECONDS, (n_series, n_points)).astype(float)
    bulk = rng.uniform(1_000, 20_000, (n_series, 1))  # 1-20 ms per request
    d_lat = d_req * bulk * np.clip(1 + 0.05 * rng.standard_normal((n_series, n_points)), 0.5, None)
    healthy_slow = rng.binomial(d_req.astype(np.int64), 0.0002)  # 0.02% of requests: below P99.9's 0.1%
    slow_us = rng.uniform(200_000, 900_000, (n_series, n_points))
    d_lat += healthy_slow * slow_us
    d_above = (healthy_slow * (slow_us > 500_000)).astype(float)
    tail = rng.random(n_series) < TAIL_SHARE
    tail_slow = rng.binomial(d_req[tail, POINTS - 12:].astype(np.int64), 0.01)
    d_lat[tail, POINTS - 12:] += tail_slow * 900_000
    d_above[tail, POINTS - 12:] += tail_slow
    start = rng.uniform(1e5, 1e8, (n_series, 1)).round()
    requests = start + np.cumsum(d_req, axis=1)
    latency = (start * bulk).round() + np.cumsum(d_lat, axis=1).round()
    above = np.cumsum(d_above, axis=1)
    for row in np.flatnonzero(rng.random(n_series) < 0.002):  # a Triton restart: counters from zero
        col = int(rng.integers(10, POINTS - 20))
        requests[row, col:] = np.cumsum(d_req[row, col:])
        latency[row, col:] = np.cumsum(d_lat[row, col:]).round()
        above[row, col:] = np.cumsum(d_above[row, col:])
    for row in np.flatnonzero(rng.random(n_series) < 0.005):  # three missed scrapes
        col = int(rng.integers(5, POINTS - 20))
        latency[row, col:col + 3] = requests[row, col:col + 3] = above[row, col:col + 3] = np.nan
    labels = [{"instance": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:8002", "job": "triton",
               "model": "ranker" if policies == 1 else f"model-{i % policies:03d}",
               "namespace": "serving", "pod": f"triton-{i // 2:05d}", "version": str(1 + i % 2)}
              for i in range(n_series)]
    return Counters(labels, ts, latency, requests, tail, above)


def range_body(name: str, labels: list[dict[str, str]], ts: np.ndarray, values: np.ndarray) -> bytes:
    """A /api/v1/query_range answer as Prometheus writes it: missed scrapes are absent points,
    integer timestamps without a fraction, sample values as strings."""
    stamps = [f'[{int(t)},"' for t in ts]
    result = []
    for lab, row in zip(labels, values):
        ok = np.isfinite(row)
        text = np.where(ok, row, 0).astype(np.int64).astype(str)
        points = ",".join(stamps[j] + text[j] + '"]' for j in np.flatnonzero(ok))
        metric = json.dumps({"__name__": name, **lab}, separators=(",", ":"))
        result.append(f'{{"metric":{metric},"values":[{points}]}}')
    return ('{"status":"success","data":{"resultType":"matrix","result":[' + ",".join(result) + "]}}").encode()


def _prometheus_app(work: Path) -> web.Application:
    labels = json.loads((work / "labels.json").read_text())
    histogram = (work / "histogram").exists()
    with np.load(work / "counters.npz") as saved:
        ts = saved["timestamps"]
        first = saved["requests"] - saved["above"] if histogram else saved["latency"]
        series = {"latency": first, "requests": saved["requests"]}
    names = {"latency": BUCKET if histogram else LATENCY, "requests": REQUESTS}
    first_labels = [{**lab, "le": "500"} for lab in labels] if histogram else labels
    cut: dict[tuple[str, int, int], tuple[bytes, bytes]] = {}  # (name, first, last column): body, gzipped

    def body(name: str, start: float, end: float) -> tuple[bytes, bytes]:
        """The answer for the points in [start, end]: the asked grid is the data's (5 s, whole seconds)."""
        lo, hi = int(np.searchsorted(ts, start - 1e-3)), int(np.searchsorted(ts, end + 1e-3, side="right"))
        if (name, lo, hi) not in cut:
            raw = range_body(names[name], first_labels if name == "latency" else labels, ts[lo:hi],
                             series[name][:, lo:hi])
            cut[name, lo, hi] = raw, gzip.compress(raw, compresslevel=6)  # Go's default level
        return cut[name, lo, hi]

    async def query_range(request: web.Request) -> web.Response:
        form = await request.post()
        arg = {k: str(request.query.get(k) or form.get(k) or "") for k in ("query", "start", "end")}
        name = "requests" if REQUESTS in arg["query"] else "latency"
        raw, packed = body(name, float(arg["start"]), float(arg["end"]))
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=packed, content_type="application/json", headers={"Content-Encoding": "gzip"})
        return web.Response(body=raw, content_type="application/json")

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="Prometheus Server is Ready.\n")

    app = web.Application(client_max_size=1 << 20)
    app.router.add_route("*", "/api/v1/query_range", query_range)
    app.router.add_get("/-/ready", ready)
    return app


def serve(port: int, work: Path) -> None:
    web.run_app(_prometheus_app(work), host=LOOPBACK, port=port, print=None, access_log=None)


# ---- measuring ------------------------------------------------------------------------------

@dataclass
class Stopwatch:
    """CPU (process-wide, all threads) and wall seconds accumulated per stage name."""

    cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    wall: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, name: str, cpu0: float, wall0: float) -> None:
        self.cpu[name] += time.process_time() - cpu0
        self.wall[name] += time.perf_counter() - wall0

    def timed(self, name: str, fn: Callable[..., T]) -> Callable[..., T]:
        def call(*args: Any, **kwargs: Any) -> T:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, cpu0, wall0)
        return call

    def timed_async(self, name: str, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        async def call(*args: Any, **kwargs: Any) -> T:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.add(name, cpu0, wall0)
        return call


@dataclass
class GcClock:
    """CPU seconds the cyclic garbage collector spent, and full (generation 2) collections, while
    `running`: the collector runs inside whichever stage allocates when a threshold is crossed, so
    its cost is spread over the stages' rows; this shows it whole."""

    cpu: float = 0.0
    full: int = 0
    _start: float = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.cpu += time.process_time() - self._start
            self.full += info["generation"] == 2

    @contextmanager
    def running(self) -> Iterator["GcClock"]:
        self.cpu, self.full = 0.0, 0
        gc.callbacks.append(self)
        try:
            yield self
        finally:
            gc.callbacks.remove(self)


def best_of(repeats: int, fn: Callable[[], object]) -> tuple[float, float]:
    """(CPU, wall) seconds of the run with the least CPU."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        fn()
        best = min(best, (time.process_time() - cpu0, time.perf_counter() - wall0))
    return best


def without_gc(fn: Callable[[], T]) -> T:
    """`fn` with the cyclic garbage collector paused: what the collector's passes over the
    millions of lists a range answer parses into cost (they are most of json.loads here)."""
    gc.disable()
    try:
        return fn()
    finally:
        gc.enable()


def policy_yaml(policies: int, histogram: bool = False) -> str:
    """One tail_excess policy per model. One model: the query names it ($model); several: one
    fleet-wide query that every policy shares (one range query, routed by the `model` label)."""
    scope = 'model="$model"' if policies == 1 else ""
    docs = []
    for i in range(policies):
        model = "ranker" if policies == 1 else f"model-{i:03d}"
        if histogram:
            query = BUCKET + "{" + ",".join(filter(None, [scope, 'le="500"'])) + "}"
            params: dict[str, Any] = {"line": 500, "evidence": "histogram", "lookback_seconds": 600}
        else:
            query, params = LATENCY + (f"{{{scope}}}" if scope else ""), {"line": 500_000, "lookback_seconds": 600}
        docs.append(json.dumps({
            "name": f"{model}-tail", "target": {"model": model},
            "triggers": [{"detector": {"type": "tail_excess", "query": query,
                                       "companionQuery": REQUESTS + (f"{{{scope}}}" if scope else ""),
                                       "interval": "5s", "params": params}}],
            "actions": [{"type": "notify", "url": "http://127.0.0.1:9/hook"}]}))
    return "\n---\n".join(docs)


@contextmanager
def fake_prometheus(work: Path, counters: Counters) -> Iterator[str]:
    """The loopback Prometheus in a subprocess, ready; stopped by its PID on exit."""
    (work / "labels.json").write_text(json.dumps(counters.labels))
    np.savez(work / "counters.npz", timestamps=counters.timestamps, latency=counters.latency,
             requests=counters.requests, above=counters.above)
    port = free_port()
    process = ManagedProcess(argv=[sys.executable, str(Path(__file__).resolve()), "serve", str(port), str(work)],
                             log_path=work / "prometheus.log", env=dict(os.environ, PYTHONPATH=str(SRC)))
    process.start()
    try:
        url = f"http://{LOOPBACK}:{port}"
        process.wait_ready(url + "/-/ready")
        yield url
    finally:
        process.stop()


@dataclass
class Row:
    stage: str
    cpu: float
    wall: float | None = None


async def measure(n_series: int, policies: int, repeats: int, work: Path, cache: bool, freeze: bool = True,
                  histogram: bool = False, led: int | None = None) -> None:
    from core.query import series_key
    from daemon.common.heap import freeze_startup_heap
    from daemon.common.logs import configure_logging
    from daemon.common.metrics import Metrics
    from daemon.sources.prometheus import PrometheusClient
    from daemon.storage.journal import Journal
    from daemon.storage.records import Verdict
    from daemon.wiring.registries import action_registry, detector_registry
    from daemon.workers.poller import Poller, pair_companions
    from detectors._grid import align, align_pointwise
    from detectors.sequential.thresholds import STORE
    from detectors.tail_excess import TailExcessDetector
    from detectors.tail_excess_batch import batch_detections
    from policies.loader import load_policies_text

    configure_logging("json", "info")  # the daemon's default: per-series debug lines are filtered out
    rng = np.random.default_rng(15)
    counters = make_counters(n_series, policies, rng)
    window = slice(0, POINTS)  # the lookback at NOW
    raw = {"latency": range_body(LATENCY, counters.labels, counters.timestamps[window], counters.latency[:, window]),
           "requests": range_body(REQUESTS, counters.labels, counters.timestamps[window], counters.requests[:, window])}
    packed = {k: gzip.compress(v, compresslevel=6) for k, v in raw.items()}
    step = slice(POINTS - 1, POINTS + 1)  # a steady-state increment: the newest cached point and the new one
    raw_step = {"latency": range_body(LATENCY, counters.labels, counters.timestamps[step], counters.latency[:, step]),
                "requests": range_body(REQUESTS, counters.labels, counters.timestamps[step],
                                       counters.requests[:, step])}
    detectors = {**detector_registry(), TailExcessDetector.kind: TailExcessDetector}
    policy_set = load_policies_text(policy_yaml(policies, histogram), "bench", action_registry(), detectors)
    if led is not None:  # a sharded replica leading `led` of the models the fleet-wide query serves
        policy_set = replace(policy_set, policies=policy_set.policies[:led])
    if histogram:
        (work / "histogram").touch()
        raw = {"latency": range_body(BUCKET, [{**lab, "le": "500"} for lab in counters.labels],
                                     counters.timestamps[window], (counters.requests - counters.above)[:, window]),
               "requests": raw["requests"]}
        packed = {k: gzip.compress(v, compresslevel=6) for k, v in raw.items()}

    with fake_prometheus(work, counters) as url:
        journal = Journal(work / "journal.db")
        client = PrometheusClient(url, timeout_seconds=120.0)
        sw = Stopwatch()
        signals = 0

        async def emit(signal: Any) -> None:  # Service.emit without the backlog: journal the signal
            nonlocal signals
            signals += 1
            await journal.signals.intake([signal])

        async def offload(fn: Callable[..., Any], *args: Any) -> Any:
            return fn(*args)

        poller = Poller(client, journal, Metrics(), detectors, sw.timed_async("emit", emit), offload,
                        incremental_range_queries=cache)
        poller.sync(policy_set)
        assert len(poller.groups) == 1, "every policy must share one range query"
        (group,) = poller.groups.values()
        # Coarse wrappers around the collaborators (a few calls per cycle, so they cost nothing).
        # `fetch`: the client (HTTP, JSON, Series); `ranges`: the range cache around it, the client included.
        setattr(client, "query_range", sw.timed_async("fetch", client.query_range))
        ranges = poller._ranges
        if ranges is not None:
            setattr(ranges, "query_range", sw.timed_async("ranges", ranges.query_range))
        setattr(poller, "_detect_all", sw.timed("detect_all", poller._detect_all))
        for watch in group.watches:
            setattr(watch.detector, "detect_many", sw.timed("detect", watch.detector.detect_many))
            setattr(watch.pairing, "pair", sw.timed("pairing", watch.pairing.pair))
        record_many = journal.evaluations.record_many  # the bound call the poller awaits in a thread
        setattr(record_many, "in_thread", sw.timed_async("journal", record_many.in_thread))

        collector = GcClock()

        async def cycle(now: float, first: bool) -> tuple[dict[str, float], dict[str, float], int]:
            """One measured poll cycle at `now`; `first`: with the range cache emptied before it."""
            if first and ranges is not None:
                ranges.clear()
            sw.cpu.clear()
            sw.wall.clear()
            fired = signals
            with collector.running():
                cpu0, wall0 = time.process_time(), time.perf_counter()
                await poller.poll_group(group, now)
                sw.add("cycle", cpu0, wall0)
            sw.cpu["gc"], sw.wall["gc"], sw.cpu["gc_full"] = collector.cpu, collector.cpu, collector.full
            return dict(sw.cpu), dict(sw.wall), signals - fired

        if freeze:
            freeze_startup_heap()  # as `tailguard run` does once the service has started
        await poller.poll_group(group, NOW)  # warm-up: the journal's rows exist from here on
        derive0, derive_cpu0 = time.perf_counter(), time.process_time()
        # The cells the steady cycles' traffic falls in too: a daemon that has run a while has
        # derived them, and the worker deriving them would count in the cycles' process_time.
        ahead = TailExcessDetector(group.watches[0].detector.params)  # type: ignore[attr-defined]
        first_rows = counters.requests - counters.above if histogram else counters.latency
        for k in range(1, STEADY_CYCLES + 1):
            cols = POINTS + k
            ahead.evaluate(counters.timestamps[:cols], first_rows[:, :cols], counters.requests[:, :cols],
                           NOW + STEP_SECONDS * k)
        assert STORE.wait(1800), "thresholds not derived"
        derived_in = (time.perf_counter() - derive0, time.process_time() - derive_cpu0)
        await poller.poll_group(group, NOW)  # the thresholds now derived, not the Wald bound
        firsts = [await cycle(NOW, first=True) for _ in range(repeats)]
        steadies = [await cycle(NOW + STEP_SECONDS * k, first=False) for k in range(1, STEADY_CYCLES + 1)]
        queries = (ranges.full_queries, ranges.incremental_queries) if ranges is not None else (0, 0)
        best = {"first": min(firsts, key=lambda c: c[0]["cycle"]), "steady": min(steadies, key=lambda c: c[0]["cycle"])}
        for cpu, wall, _ in best.values():
            for d in (cpu, wall):
                for k in ("emit", "journal"):
                    d.setdefault(k, 0.0)
                d.setdefault("ranges", d["fetch"])
                d["cache"] = d["ranges"] - d["fetch"]
                d.setdefault("pairing", 0.0)  # the poller pairs companions before prepare and detection
                d["rest"] = d["cycle"] - d["ranges"] - d["pairing"] - d["detect_all"] - d["journal"] - d["emit"]
        verdicts = journal.evaluations.all()
        fired = sum(v.fired for v in verdicts)
        unpaired = sum(v.reason.startswith("no request count") for v in verdicts)

        # The same stages once more, standalone on the same answers, for the detail table.
        start, end = NOW - group.lookback, NOW
        result = await client.query_range(group.query, start, end, group.interval)
        companions = await client.query_range(group.companion or "", start, end, group.interval)
        assert result.error is None and companions.error is None, (result.error, companions.error)
        mine = [[s for s in result.series if poller._belongs(w, s)] for w in group.watches]
        watch = group.watches[0]  # every policy's params are alike
        params = watch.detector.params  # type: ignore[attr-defined]
        det = TailExcessDetector(params)

        def library() -> None:
            from datetime import datetime, timezone
            for q in (group.query, group.companion or ""):
                client._api.custom_query_range(q, datetime.fromtimestamp(start, timezone.utc),
                                               datetime.fromtimestamp(end, timezone.utc), "5s")

        def aligned(fn: Callable[..., tuple[np.ndarray, np.ndarray]] = align) -> list[tuple[np.ndarray, np.ndarray]]:
            out = []
            for m in mine:
                pairs = [c for c in pair_companions(m, companions) if c is not None]
                out.append(fn([*m, *pairs]))
            return out

        grids = aligned()

        def evaluate() -> list[Any]:
            return [det.evaluate(g, v[:len(m)], v[len(m):], NOW) for (g, v), m in zip(grids, mine)]

        batches = evaluate()
        rows = [Verdict(w.policy.name, w.bound.index, series_key(s.labels), bool(b.fired[i]), "reason " * 12)
                for w, m, b in zip(group.watches, mine, batches) for i, s in enumerate(m)]
        detail = [
            Row("json.loads of both bodies (baseline)", *best_of(repeats, lambda: [json.loads(b) for b in raw.values()])),
            Row("json.loads of both bodies, cyclic GC paused", *best_of(repeats, lambda: without_gc(
                lambda: [json.loads(b) for b in raw.values()]))),
            Row("json.loads of both steady-state increment bodies (2 points per series)",
                *best_of(repeats, lambda: [json.loads(b) for b in raw_step.values()])),
            Row("gzip.decompress of both bodies", *best_of(repeats, lambda: [gzip.decompress(b) for b in packed.values()])),
            Row("prometheus-api-client: 2 x custom_query_range (HTTP, gunzip, JSON)", *best_of(repeats, library)),
            Row("routing: _belongs", *best_of(repeats, lambda: [[s for s in result.series if poller._belongs(w, s)]
                                                                for w in group.watches])),
            Row("pairing: pair_companions", *best_of(repeats, lambda: [pair_companions(m, companions) for m in mine])),
            Row("detection: align (pairing included)", *best_of(repeats, aligned)),
            Row("detection: align point by point, as before (pairing included)",
                *best_of(repeats, lambda: aligned(align_pointwise))),
            Row("detection: evaluate_excess_batch", *best_of(repeats, evaluate)),
            Row("detection: batch_detections (every row's Detection)", *best_of(repeats, lambda: [
                batch_detections(b, "tail_excess", [s.labels for s in m]) for b, m in zip(batches, mine)])),
            Row("verdict rows: series_key per series", *best_of(repeats, lambda: [series_key(s.labels)
                                                                                  for m in mine for s in m])),
            Row("journal: Evaluations.record_many (sync)",
                *best_of(repeats, lambda: journal.evaluations.record_many(rows))),
        ]
        client.close()
        journal.close()

    base = detail[0].cpu
    mb = {k: len(v) / 1e6 for k, v in raw.items()}
    mbz = {k: len(v) / 1e6 for k, v in packed.items()}
    mbs = {k: len(v) / 1e6 for k, v in raw_step.items()}
    print(f"thresholds for every traffic the series carry: derived once before the measured cycles in "
          f"{derived_in[0]:.1f} s wall, {derived_in[1]:.1f} CPU-s (the daemon derives them in the background)")
    print(f"{n_series:,} {'bucket' if histogram else 'latency'} + {n_series:,} request counters, {POINTS} points at {STEP_SECONDS:g} s, "
          f"{policies} polic{'y' if policies == 1 else 'ies'} on one range query"
          f"{'' if led is None else f' ({led} loaded, as a replica leading {led} of them)'}; bodies "
          f"{mb['latency']:.1f} + {mb['requests']:.1f} MB ({mbz['latency']:.1f} + {mbz['requests']:.1f} MB gzip), "
          f"steady-state increments {mbs['latency']:.1f} + {mbs['requests']:.1f} MB; range cache "
          f"{'on' if cache else 'off'} ({queries[0]} full, {queries[1]} incremental range queries); first cycle: "
          f"best of {repeats}, steady state: best of {STEADY_CYCLES}, after a warm-up\n")
    for kind, title in (("first", "first cycle: range cache empty, 2 full range queries"),
                        ("steady", "steady state: 2 incremental range queries")):
        cpu, wall, fired_now = best[kind]
        total = cpu["cycle"]
        stages = [("fetch + parse: 2 range queries (HTTP, gunzip, JSON, Series)", "fetch"),
                  ("range cache: merge, trim, copy out", "cache"),
                  ("routing (_belongs) and verdict rows (series_key, metrics, log)", "rest"),
                  ("companion pairing (pair_companions)", "pairing"),
                  ("detection: tail_excess detect_many", "detect"),
                  ("journal: evaluations.record_many, one transaction", "journal"),
                  (f"signals: {fired_now} fired -> signals.intake", "emit")]
        print(f"| {title} (inside one real Poller.poll_group) | CPU ms | wall ms | share of CPU | x json.loads |")
        print("|---|---|---|---|---|")
        for name, key in stages:
            print(f"| {name} | {1000 * cpu[key]:.1f} | {1000 * wall[key]:.1f} | {cpu[key] / total:.0%} | "
                  f"{cpu[key] / base:.2f}x |")
        print(f"| **whole cycle** | **{1000 * total:.1f}** | **{1000 * wall['cycle']:.1f}** | 100% | "
              f"**{total / base:.2f}x** |")
        print(f"| of which the cyclic GC, in the stages above ({int(cpu['gc_full'])} full collections) | "
              f"{1000 * cpu['gc']:.1f} | | {cpu['gc'] / total:.0%} | {cpu['gc'] / base:.2f}x |")
        print(f"| baseline: json.loads of the two full bodies | {1000 * base:.1f} | {1000 * detail[0].wall:.1f} "
              f"| | 1.00x |\n")
    print("| detail (standalone, same data) | CPU ms | wall ms | x json.loads |")
    print("|---|---|---|---|")
    for r in detail:
        print(f"| {r.stage} | {1000 * r.cpu:.1f} | {1000 * (r.wall or 0):.1f} | {r.cpu / base:.2f}x |")
    print(f"\nverdicts journaled: {len(verdicts):,} ({fired} fired in the last cycle; {int(counters.tail.sum())} tails "
          f"planted; {unpaired} without a request counter)")
    for kind, cycles in (("first", firsts), ("steady", steadies)):
        total = best[kind][0]["cycle"]
        verdict = "within" if total < BUDGET_CPU_SECONDS else "OVER"
        every = " / ".join(f"{c['cycle']:.3f} ({c['gc']:.3f} GC, {int(c['gc_full'])} full)" for c, _, _ in cycles)
        print(f"{kind} cycle: {total:.3f} CPU-s, budget {BUDGET_CPU_SECONDS:g} CPU-s at 10,000 series: {verdict}"
              + ("" if n_series == 10_000 else f" (this run: {n_series:,} series)") + f"; every one: {every}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 series, 2 repeats")
    parser.add_argument("--series", type=int, default=None, help="series per query (default 10,000)")
    parser.add_argument("--policies", type=int, default=1,
                        help="policies (models) sharing one fleet-wide query (default 1: one model)")
    parser.add_argument("--led", type=int, default=None,
                        help="load only the first K of the --policies (a sharded replica's share); the "
                             "answer still holds every model's series")
    parser.add_argument("--no-cache", action="store_true",
                        help="the poller without its range cache: every cycle asks for the whole lookback")
    parser.add_argument("--histogram", action="store_true",
                        help="the same traffic as a histogram: the bucket at the line and the count")
    parser.add_argument("--no-freeze", action="store_true",
                        help="without freezing the start-up heap (the daemon freezes it once started)")
    args = parser.parse_args()
    n_series = args.series or (1_000 if args.quick else 10_000)
    with tempfile.TemporaryDirectory(prefix="bench-poll-") as tmp:
        asyncio.run(measure(n_series, args.policies, 2 if args.quick else 3, Path(tmp), not args.no_cache,
                            not args.no_freeze, args.histogram, args.led))


if __name__ == "__main__":
    main()
