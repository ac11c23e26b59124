"""The histogram sources tail_excess reads first (Triton's first-response histogram, Istio's request
duration, a gateway's histogram in seconds), from expositions written as each exporter writes them
(fixtures/exposition/README.md says how they were built): served on loopback scrape by scrape, read
by the direct reader (daemon/sources/triton_metrics.py) and decided by the live detector. A line in
another unit than the histogram's fails to load; a histogram that cannot be read as counts (bounds
that change, no bound at or above the line, buckets that decrease, no `+Inf`, a counter reset) is a
reason, never a fire, never a raise."""
from __future__ import annotations

from typing import AsyncIterator, Callable, Mapping

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from core.query import Series
from daemon.sources.prometheus import RangeResult
from daemon.sources.triton_metrics import TritonMetricsSource
from daemon.wiring.registries import action_registry, detector_registry
from detectors.sequential.thresholds import STORE
from detectors.tail_excess import TailExcessDetector, TailExcessParams
from policies.loader import PolicyLoadError, load_policies_text
from tests.support.exposition import cumulative, rewrite
from tests.support.paths import REPO

EXPOSITION = REPO / "fixtures" / "exposition"
EXAMPLES = REPO / "examples" / "policies"
START = 1_767_225_600.0


class Exporter:
    """A loopback /metrics serving `text` as it is when scraped (tests rewrite it between scrapes)."""

    def __init__(self) -> None:
        self.text = ""
        self.http: aiohttp.ClientSession | None = None  # the reader's session (the fixture's)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/metrics"

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.text, content_type="text/plain")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def exporter() -> AsyncIterator[Exporter]:
    e = Exporter()
    await e.start()
    try:
        async with aiohttp.ClientSession() as http:
            e.http = http
            yield e
    finally:
        await e.stop()


class Scraper:
    """The direct reader on a fake clock: one scrape a second of whatever the exporter serves."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.now = START
        self.url = url
        self.source = TritonMetricsSource(http, history_seconds=3600, min_interval=0.5, clock=lambda: self.now)

    async def scrape(self) -> None:
        self.now += 1.0
        await self.source.query_range("up", self.now - 1, self.now, 1.0, [self.url])  # the scrape itself

    async def query(self, query: str) -> RangeResult:
        return await self.source.query_range(query, START, self.now, 1.0, [self.url])


def decide(det: TailExcessDetector, buckets: RangeResult, counts: RangeResult, now: float, version_label: str):
    """The live detector on the reader's answer, each bucket paired with its version's count."""
    by_version = {s.labels[version_label]: s for s in counts.series}
    series = sorted(buckets.series, key=lambda s: s.labels[version_label])
    pairs = [by_version.get(s.labels[version_label]) for s in series]
    det.detect_many(series, now, pairs)
    assert STORE.wait()
    return {s.labels[version_label]: d for s, d in zip(series, det.detect_many(series, now, pairs))}


async def run_source(exporter: Exporter, template: str, family: str, version_label: str, bounds: list[str],
                     slow_at: float, shares: Mapping[str, float], seconds: int,
                     spoil: Callable[[int, dict[str, dict[str, float]]], None] | None = None) -> Scraper:
    """`seconds` scrapes of the exposition with 40 requests a second per version, a share of them
    at `slow_at` (seeded), optionally spoiled at some scrapes."""
    rng = np.random.default_rng(7)
    fast = {v: 0 for v in shares}
    slow = {v: 0 for v in shares}
    assert exporter.http is not None
    scraper = Scraper(exporter.http, exporter.url)
    for second in range(seconds):
        values: dict[str, dict[str, float]] = {}
        for v, share in shares.items():
            n_slow = int(rng.binomial(40, share))
            fast[v] += 40 - n_slow
            slow[v] += n_slow
            values[v] = cumulative(bounds, fast[v], slow[v], slow_at, fast[v] + slow[v])
        if spoil is not None:
            spoil(second, values)
        exporter.text = rewrite(template, family, version_label, values)
        await scraper.scrape()
    return scraper


TRITON = "nv_inference_first_response_histogram_ms"
TRITON_BOUNDS = ["100", "500", "2000", "5000", "+Inf"]


def _template(name: str) -> str:
    return (EXPOSITION / name).read_text()


def _example_trigger(name: str) -> tuple[str, str, TailExcessParams]:
    """An example policy's detector trigger as the loader binds it (queries rendered for ranker)."""
    (policy,) = load_policies_text((EXAMPLES / name).read_text(), name, action_registry(),
                                   detector_registry()).policies
    (bound,) = policy.detectors
    params = bound.params
    assert isinstance(params, TailExcessParams) and params.evidence == "histogram"
    assert bound.trigger.companion_query is not None
    render = {"$model": policy.target.model, "$namespace": policy.target.namespace}

    def fill(q: str) -> str:
        for k, v in render.items():
            q = q.replace(k, v)
        return q
    return fill(bound.trigger.query), fill(bound.trigger.companion_query), params


@pytest.mark.slow  # 120 scrapes and the thresholds derived for their traffic: 0.5-4 s
async def test_triton_first_response_histogram_example_fires_on_the_slow_version(exporter: Exporter):
    """ranker-histogram.yaml's own queries and params on Triton's exposition read every second:
    v2 with 2% of first responses at 900 ms fires within 2 minutes, healthy v1 does not."""
    query, companion, params = _example_trigger("ranker-histogram.yaml")
    assert params.line == 500 and params.line_unit == "ms"
    scraper = await run_source(exporter, _template("triton_first_response_histogram.txt"), TRITON, "version",
                               TRITON_BOUNDS, 900.0, {"1": 0.0002, "2": 0.02}, 120)
    buckets, counts = await scraper.query(query), await scraper.query(companion)
    assert buckets.partial == () and {s.labels["le"] for s in buckets.series} == {"500"}
    verdicts = decide(TailExcessDetector(params), buckets, counts, scraper.now, "version")
    assert verdicts["2"].fired and verdicts["2"].details["evidence"] == "histogram"
    assert not verdicts["1"].fired and "no excess" in verdicts["1"].reason


@pytest.mark.slow  # 120 scrapes and the thresholds derived for their traffic: 0.5-4 s
async def test_istio_example_reads_the_mesh_histogram_per_destination_version(exporter: Exporter):
    """ranker-istio.yaml's queries on a destination sidecar's exposition (Envoy's bounds, `le="500"`):
    the canary v2 with 2% at 600 ms fires, v1 does not."""
    query, companion, params = _example_trigger("ranker-istio.yaml")
    assert params.version_label == "destination_version"
    bounds = ["0.5", "1", "5", "10", "25", "50", "100", "250", "500", "1000", "2500", "5000", "10000", "30000",
              "60000", "300000", "600000", "1800000", "3600000", "+Inf"]
    scraper = await run_source(exporter, _template("istio_request_duration.txt"), "istio_request_duration_milliseconds",
                               "destination_version", bounds, 600.0, {"v1": 0.0, "v2": 0.02}, 120)
    buckets, counts = await scraper.query(query), await scraper.query(companion)
    assert len(buckets.series) == 2 and buckets.partial == ()
    verdicts = decide(TailExcessDetector(params), buckets, counts, scraper.now, "destination_version")
    assert verdicts["v2"].fired and not verdicts["v1"].fired


GATEWAY_POLICY = """
name: gw
target: {{model: ranker, triton: {{endpoints: ["http://127.0.0.1:9"]}}}}
triggers:
  - detector:
      type: tail_excess
      source: triton
      query: 'gateway_request_duration_seconds_bucket{{model="$model", le="{le}"}}'
      companionQuery: 'gateway_request_duration_seconds_count{{model="$model"}}'
      params: {{line: {line}, line_unit: {unit}, evidence: histogram}}
actions:
  - {{type: triton.rollback, to: previous}}
"""


def _load_gateway(le: str, line: str, unit: str) -> TailExcessParams:
    text = GATEWAY_POLICY.format(le=le, line=line, unit=unit)
    (policy,) = load_policies_text(text, "gw.yaml", action_registry(), detector_registry()).policies
    params = policy.detectors[0].params
    assert isinstance(params, TailExcessParams)
    return params


def test_a_line_in_another_unit_than_the_histogram_fails_to_load_with_the_line_to_write():
    with pytest.raises(PolicyLoadError) as caught:
        _load_gateway("0.5", "500", "ms")
    message = str(caught.value)
    assert "the line is 500 ms but gateway_request_duration_seconds is in s: write line: 0.5" in message
    assert "nothing is converted" in message
    with pytest.raises(PolicyLoadError, match="states no unit in its name"):
        load_policies_text(GATEWAY_POLICY.format(le="0.5", line="0.5", unit="s").replace(
            "gateway_request_duration_seconds", "gateway_latency"), "gw.yaml", action_registry(), detector_registry())
    # Counters too: Triton's `_us` counter with a line written in ms.
    assert TailExcessParams(line=500, line_unit="ms").query_problem(
        'nv_inference_compute_infer_duration_us{model="ranker"}', "x") is not None
    assert TailExcessParams(line=500000, line_unit="us").query_problem(
        'nv_inference_compute_infer_duration_us{model="ranker"}', "x") is None


@pytest.mark.slow  # 120 scrapes and the thresholds derived for their traffic: 0.5-4 s
async def test_a_gateway_histogram_in_seconds_with_the_line_in_seconds(exporter: Exporter):
    """The same 500 ms line on a histogram in seconds: line 0.5, line_unit s, the bucket `le="0.5"`
    (the Python client's `0.5`, matched as a number); v2 with 2% at 0.9 s fires."""
    params = _load_gateway("0.5", "0.5", "s")
    bounds = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "+Inf"]
    scraper = await run_source(exporter, _template("gateway_request_duration.txt"), "gateway_request_duration_seconds",
                               "version", bounds, 0.9, {"1": 0.0, "2": 0.02}, 120)
    buckets = await scraper.query('gateway_request_duration_seconds_bucket{model="ranker", le="0.50"}')
    counts = await scraper.query('gateway_request_duration_seconds_count{model="ranker"}')
    assert {s.labels["le"] for s in buckets.series} == {"0.5"}
    verdicts = decide(TailExcessDetector(params), buckets, counts, scraper.now, "version")
    assert verdicts["2"].fired and not verdicts["1"].fired


# Bad input: each a reason, never a fire, never a raise.

BREACH = {"1": 0.0, "2": 0.05}  # v2 would fire within seconds if its evidence were read


async def _bad(exporter: Exporter, spoil: Callable[[int, dict[str, dict[str, float]]], None],
               bounds: list[str] = TRITON_BOUNDS, seconds: int = 90) -> tuple[Scraper, dict[str, object]]:
    scraper = await run_source(exporter, _template("triton_first_response_histogram.txt"), TRITON, "version",
                               bounds, 900.0, BREACH, seconds, spoil)
    buckets = await scraper.query(f'{TRITON}_bucket{{model="ranker", le="500"}}')
    counts = await scraper.query(f'{TRITON}_count{{model="ranker"}}')
    verdicts = decide(TailExcessDetector(TailExcessParams(line=500, evidence="histogram")), buckets, counts,
                      scraper.now, "version") if buckets.series else {}
    return scraper, {"partial": buckets.partial, "verdicts": verdicts}


def _spoil_from(start: int, change: Callable[[dict[str, float]], None]) -> Callable[[int, dict], None]:
    def spoil(second: int, values: dict[str, dict[str, float]]) -> None:
        if second >= start:
            change(values["2"])
    return spoil


async def test_buckets_that_decrease_leave_the_scrape_out_and_say_why(exporter: Exporter):
    """An exporter writing per-bucket counts (not cumulative): le=500 below le=100. Read as
    cumulative, count - le500 would be most requests above the line."""
    def per_bucket(v: dict[str, float]) -> None:
        v["500"] = 3.0  # far below le=100
    _, out = await _bad(exporter, _spoil_from(30, per_bucket))
    assert any("buckets decrease: le=100" in p and "not cumulative" in p for p in out["partial"])
    v2 = out["verdicts"]["2"]
    assert not v2.fired and v2.reason.startswith("stale")  # nothing of v2 kept since second 30


async def test_a_missing_inf_bucket_leaves_the_scrape_out(exporter: Exporter):
    scraper = await run_source(exporter, _template("triton_first_response_histogram.txt"), TRITON, "version",
                               TRITON_BOUNDS, 900.0, BREACH, 40)
    exporter.text = "\n".join(line for line in exporter.text.splitlines()
                              if not ('version="2"' in line and 'le="+Inf"' in line)) + "\n"
    await scraper.scrape()
    buckets = await scraper.query(f'{TRITON}_bucket{{model="ranker", le="500"}}')
    assert any('no le="+Inf" bucket' in p and 'version="2"' in p for p in buckets.partial)
    assert not any('version="1"' in p for p in buckets.partial)
    (v2,) = [s for s in buckets.series if s.labels["version"] == "2"]
    assert v2.timestamps[-1] == START + 40  # the scrape without +Inf kept nothing of v2


async def test_bounds_that_change_between_scrapes_leave_that_scrape_out_and_a_lost_bound_is_said(exporter: Exporter):
    """A model reloaded with other buckets (500 replaced by 600): the scrape where the bounds change
    is left out, and from then on the answer says the bucket the query selects is gone."""
    scraper = await run_source(exporter, _template("triton_first_response_histogram.txt"), TRITON, "version",
                               TRITON_BOUNDS, 900.0, BREACH, 30)
    exporter.text = exporter.text.replace('version="2",le="500"', 'version="2",le="600"')
    await scraper.scrape()
    changed = await scraper.query(f'{TRITON}_bucket{{model="ranker", le="500"}}')
    assert any("bounds changed between scrapes (100, 500, 2000, 5000, +Inf -> 100, 600, 2000, 5000, +Inf)" in p
               for p in changed.partial)
    await scraper.scrape()
    after = await scraper.query(f'{TRITON}_bucket{{model="ranker", le="500"}}')
    assert any('no bucket le=500 (its bounds: 100, 600, 2000, 5000, +Inf)' in p for p in after.partial)
    for scraped in (changed, after):  # v2's bucket at 500 gained no point since it vanished
        (v2,) = [s for s in scraped.series if s.labels["version"] == "2"]
        assert v2.timestamps[-1] == START + 30


async def test_a_counter_reset_is_one_step_left_out_not_slow_requests(exporter: Exporter):
    """Triton restarted (the counts start again from zero): never read as a burst."""
    def restart(second: int, values: dict[str, dict[str, float]]) -> None:
        if second >= 45:
            for v in values.values():
                for k in v:
                    v[k] = max(0.0, v[k] - 1800.0 * (k != "sum"))
    scraper = await run_source(exporter, _template("triton_first_response_histogram.txt"), TRITON, "version",
                               TRITON_BOUNDS, 900.0, {"1": 0.0, "2": 0.0}, 90, restart)
    buckets = await scraper.query(f'{TRITON}_bucket{{model="ranker", le="500"}}')
    counts = await scraper.query(f'{TRITON}_count{{model="ranker"}}')
    verdicts = decide(TailExcessDetector(TailExcessParams(line=500, evidence="histogram")), buckets, counts,
                      scraper.now, "version")
    for d in verdicts.values():
        assert not d.fired and d.details["counter_resets"] == 1 and d.details["window_above_line"] == 0.0


def test_no_bound_at_or_above_the_line_is_refused_at_load_and_a_reason_at_run_time():
    """The policy shows it (a bucket below the line fails to load; one Triton does not have by
    default is said by `tailguard validate`); at run time a bucket below the line decides nothing."""
    from detectors.histogram_shape import bound_at_or_above, bounds_note
    query = f'{TRITON}_bucket{{model="ranker", le="600"}}'
    assert "not among 100, 500, 2000, 5000" in (bounds_note(query, 600.0) or "")
    assert bounds_note(f'{TRITON}_bucket{{model="ranker", le="500"}}', 500.0) is None
    assert bound_at_or_above([100, 500, float("inf")], 600) is None
    p = TailExcessParams(line=600, evidence="histogram")
    assert "below the line" in (p.query_problem(f'{TRITON}_bucket{{model="m", le="500"}}', "c") or "")
    ts = tuple(START + i for i in range(120))
    bucket = Series({"version": "2", "le": "500"}, ts, tuple(float(38 * i) for i in range(120)))
    count = Series({"version": "2"}, ts, tuple(float(40 * i) for i in range(120)))
    det = TailExcessDetector(p)
    det.detect(bucket, ts[-1], count)
    assert STORE.wait()
    d = det.detect(bucket, ts[-1], count)
    assert not d.fired and "below the line" in d.reason


def test_the_fixtures_say_they_were_built_not_captured():
    readme = (EXPOSITION / "README.md").read_text()
    assert "not captured" in readme
    for name in ("triton_first_response_histogram.txt", "istio_request_duration.txt", "gateway_request_duration.txt"):
        assert name in readme and (EXPOSITION / name).exists()




def test_through_prometheus_a_bucket_that_vanishes_is_stale_never_read_as_slow():
    """Prometheus answers the bucket and the count as separate series: when the bounds change the
    selected bucket stops while the count goes on. The version goes stale; nothing fires."""
    ts = tuple(START + i for i in range(120))
    count = Series({"version": "2"}, ts, tuple(float(40 * i) for i in range(120)))
    bucket = Series({"version": "2", "le": "500"}, ts[:60], tuple(float(40 * i) for i in range(60)))
    det = TailExcessDetector(TailExcessParams(line=500, evidence="histogram"))
    det.detect(bucket, ts[-1], count)
    assert STORE.wait()
    d = det.detect(bucket, ts[-1], count)
    assert not d.fired and d.reason.startswith("stale")


async def test_a_bound_that_is_no_number_leaves_the_scrape_out(exporter: Exporter):
    scraper = await run_source(exporter, _template("triton_first_response_histogram.txt"), TRITON, "version",
                               TRITON_BOUNDS, 900.0, BREACH, 20)
    exporter.text = exporter.text.replace('version="2",le="2000"', 'version="2",le="2s"')
    await scraper.scrape()
    buckets = await scraper.query(f'{TRITON}_bucket{{model="ranker", le="500"}}')
    assert any("le='2s' is not a number" in p for p in buckets.partial)


def test_the_inf_bucket_is_no_bound_above_the_line():
    """`le="+Inf"` is at or above any line, and counts nothing above it: refused at load."""
    problem = TailExcessParams(line=500, evidence="histogram").query_problem(
        f'{TRITON}_bucket{{model="m", le="+Inf"}}', f'{TRITON}_count{{model="m"}}')
    assert problem is not None and "nothing is counted" in problem and "bound at the line (500)" in problem
