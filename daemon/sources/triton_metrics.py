"""Triton's own `/metrics`, read directly: a detector source for when Prometheus' scrape interval is
the bottleneck (docs/detectors.md says what it costs and when to turn it on).

Each query scrapes the endpoints (at most once per `min_interval` however many triggers ask), keeps
the samples in a bounded in-memory history and answers like a Prometheus range query over that
history: one series per metric and label set, with an `instance` label per endpoint. The history
lives in this process only: after a restart a detector has what was scraped since, and the
Prometheus path (which keeps history) is the one to use where that matters.

Histograms (Triton's `nv_inference_first_response_histogram_ms`) are checked as a whole on every
scrape (detectors/histogram_shape.py): a histogram without `+Inf`, with buckets that decrease, a
count other than `+Inf`'s, or bounds other than the last scrape's has none of its samples of that
scrape kept (never read as slow requests), and the answer's `partial` names it and why, as it
names a bucket the query selects that the histogram no longer has. A `le` matcher compares bounds
as numbers (`le="500"` selects Triton's `500` and a Python client's `500.0`).
"""
from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from core.query import Series
from daemon.sources.prometheus import RangeResult
from detectors.histogram_shape import bounds_change, histogram_base, snapshot_problem

# name{label="value", ...}: the only query form this source answers (no functions, no operators).
_SELECTOR = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
MAX_BODY_BYTES = 8 * 1024 * 1024  # a Triton with hundreds of models exports well under this


class SelectorError(ValueError):
    """The query is not a plain `name{label="value"}` selector."""


def parse_selector(query: str) -> tuple[str, dict[str, str]]:
    """`name{a="1",b="2"}` -> ("name", {"a": "1", "b": "2"}); raises SelectorError otherwise."""
    m = _SELECTOR.match(query)
    if m is None:
        raise SelectorError(f"source: triton takes a metric selector like "
                            f"nv_inference_request_success{{model=\"ranker\"}}, not {query!r}")
    name, body = m.group(1), (m.group(2) or "").strip()
    matchers: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        mm = _MATCHER.match(body, pos)
        if mm is None:
            raise SelectorError(f"only label=\"value\" matchers are supported: {query!r}")
        matchers[mm.group(1)] = mm.group(2).replace('\\"', '"').replace("\\\\", "\\")
        pos = mm.end()
    return name, matchers


def metrics_url(endpoint: str) -> str:
    """Triton's metrics URL for an inference endpoint: same host, port 8002 (Triton's default)."""
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.hostname}:8002/metrics"


def parse_exposition(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample in a text exposition. A counter is kept under
    its exposed name: the parser appends `_total` to Triton's counters, PromQL does not."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if family.type == "counter" and name == f"{family.name}_total":
                name = family.name
            yield name, dict(sample.labels), float(sample.value)


LabelKey = tuple[tuple[str, str], ...]
HistogramKey = tuple[str, str, LabelKey]  # (url, family, labels without `le`)


def bound_value(le: str) -> float | None:
    """A `le` label as a number (`+Inf` included), None when it is not one."""
    try:
        return float(le)
    except ValueError:
        return None


def histogram_snapshots(samples: Iterable[tuple[str, dict[str, str], float]]
                        ) -> dict[tuple[str, LabelKey], tuple[dict[float, float], float | None, str | None]]:
    """Per histogram of one scrape (family, labels without `le`): its buckets by bound, its
    `_count` (None: not exposed) and a problem no bucket table shows (a `le` that is no number)."""
    buckets: dict[tuple[str, LabelKey], dict[float, float]] = {}
    counts: dict[tuple[str, LabelKey], float] = {}
    bad_le: dict[tuple[str, LabelKey], str] = {}
    for name, labels, value in samples:
        if name.endswith("_bucket") and "le" in labels:
            key = (name[: -len("_bucket")], tuple(sorted((k, v) for k, v in labels.items() if k != "le")))
            bound = bound_value(labels["le"])
            if bound is None:
                bad_le[key] = f"le={labels['le']!r} is not a number"
                continue
            buckets.setdefault(key, {})[bound] = value
        elif name.endswith("_count"):
            counts[(name[: -len("_count")], tuple(sorted(labels.items())))] = value
    return {key: (table, counts.get(key), bad_le.get(key)) for key, table in buckets.items()}


def _labels_text(labels: LabelKey) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def _matches(matchers: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Every matcher holds; `le` compared as a number (exporters write bounds differently)."""
    for k, want in matchers.items():
        have = labels.get(k)
        if have is None:
            return False
        if k == "le":
            a, b = bound_value(want), bound_value(have)
            if a is None or a != b:
                return False
        elif have != want:
            return False
    return True


@dataclass
class _History:
    """Samples of one scraped series, oldest first, bounded."""

    # Two hours and a little at one scrape a second: tail_excess's longest lookback (slow traffic).
    points: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=7_300))


class TritonMetricsSource:
    """Range queries over Triton's own /metrics, scraped on demand."""

    def __init__(self, http: aiohttp.ClientSession, history_seconds: float = 900.0,
                 min_interval: float = 0.5, timeout_seconds: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._http = http
        self._history_seconds = history_seconds
        self._min_interval = min_interval
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._clock = clock
        self._series: dict[tuple[str, str, tuple[tuple[str, str], ...]], _History] = {}
        self._bounds: dict[HistogramKey, tuple[float, ...]] = {}  # each histogram's bounds at its last scrape
        self._problems: dict[HistogramKey, str] = {}  # why its last scrape was left out
        self._last_scrape: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def query_range(self, query: str, start: float, end: float, step_seconds: float,
                          endpoints: Iterable[str]) -> RangeResult:
        """Series of `query` (a selector) between start and end from every endpoint; an endpoint
        that cannot be scraped is named in the answer's `partial` (never a silent partial) and the
        others' series are returned; every endpoint failing is the answer's error."""
        try:
            name, matchers = parse_selector(query)
        except SelectorError as exc:
            return RangeResult(query, error=str(exc))
        urls = sorted(set(endpoints))
        if not urls:
            return RangeResult(query, error="source: triton needs triton.metricsEndpoints or "
                                            "static triton.endpoints on the target")
        outcomes = await asyncio.gather(*(self._scrape(u) for u in urls))
        errors = tuple(e for e in outcomes if e)
        if len(errors) == len(urls):
            return RangeResult(query, error="; ".join(errors))
        read = [u for u, e in zip(urls, outcomes) if not e]  # one replica down leaves the others watched
        return RangeResult(query, self._select(name, matchers, read, start, end),
                           partial=errors + self._histogram_problems(name, matchers, read))

    def _histogram_problems(self, name: str, matchers: Mapping[str, str], urls: list[str]) -> tuple[str, ...]:
        """What the query's histograms showed at their last scrape that the detector cannot see in
        the series: a scrape left out and why, or the selected bucket no longer among the bounds."""
        family = histogram_base(name)
        others = {k: v for k, v in matchers.items() if k != "le"}
        out = []
        for (url, base, labels), text in sorted(self._problems.items()):
            if base == family and url in urls and _matches(others, dict(labels)):
                out.append(f"{text}: histogram {base}{_labels_text(labels)} at {url}, its samples of that scrape "
                           "left out")
        wanted = bound_value(matchers["le"]) if name.endswith("_bucket") and "le" in matchers else None
        if wanted is not None:
            for (url, base, labels), bounds in sorted(self._bounds.items()):
                if (base == family and url in urls and _matches(others, dict(labels)) and wanted not in bounds
                        and (url, base, labels) not in self._problems):
                    shown = ", ".join("+Inf" if b == float("inf") else f"{b:g}" for b in bounds)
                    out.append(f"no bucket le={matchers['le']} (its bounds: {shown}): nothing above the line can "
                               f"be counted: histogram {base}{_labels_text(labels)} at {url}")
        return tuple(out)

    def _select(self, name: str, matchers: Mapping[str, str], urls: list[str], start: float,
                end: float) -> list[Series]:
        out = []
        for (url, sname, labels), hist in self._series.items():
            if sname not in (name, name.removesuffix("_total")) or url not in urls:
                continue
            lab = dict(labels)
            if not _matches(matchers, lab):
                continue
            pts = [(t, v) for t, v in hist.points if start <= t <= end]
            if pts:
                lab["__name__"] = name
                lab["instance"] = urlsplit(url).netloc
                out.append(Series(lab, tuple(t for t, _ in pts), tuple(v for _, v in pts)))
        return out

    async def _scrape(self, url: str) -> str | None:
        """Scrape `url` unless it was scraped within min_interval; the error text, or None."""
        lock = self._locks.setdefault(url, asyncio.Lock())
        async with lock:  # concurrent triggers share one scrape
            now = self._clock()
            if now - self._last_scrape.get(url, float("-inf")) < self._min_interval:
                return None
            try:
                async with self._http.get(url, timeout=self._timeout) as resp:
                    if resp.status != 200:
                        return f"{url}: HTTP {resp.status}"
                    body = await resp.content.read(MAX_BODY_BYTES + 1)
                    if len(body) > MAX_BODY_BYTES:
                        return f"{url}: exposition larger than {MAX_BODY_BYTES} bytes"
                    samples = list(parse_exposition(body.decode("utf-8", "replace")))
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                return f"{url}: {type(exc).__name__}: {exc}"
            stamp = self._clock()
            self._last_scrape[url] = stamp
            left_out = self._check_histograms(url, samples)
            for sname, labels, value in samples:
                if left_out and (histogram_base(sname),
                                 tuple(sorted((k, v) for k, v in labels.items() if k != "le"))) in left_out:
                    continue
                key = (url, sname, tuple(sorted(labels.items())))
                hist = self._series.get(key)
                if hist is None:
                    hist = self._series[key] = _History()
                hist.points.append((stamp, value))
            self._forget_before(stamp - self._history_seconds)
            return None

    def _check_histograms(self, url: str, samples: list[tuple[str, dict[str, str], float]]
                          ) -> set[tuple[str, LabelKey]]:
        """Checks every histogram of one scrape of `url`; the ones whose samples are left out."""
        snapshots = histogram_snapshots(samples)
        for key in [k for k in self._problems if k[0] == url]:
            del self._problems[key]
        for key in [k for k in self._bounds if k[0] == url and (k[1], k[2]) not in snapshots]:
            del self._bounds[key]  # a histogram gone from the exposition (an unloaded version)
        left_out: set[tuple[str, LabelKey]] = set()
        for (base, labels), (buckets, count, bad_le) in snapshots.items():
            key = (url, base, labels)
            bounds = tuple(sorted(buckets))
            problem = bad_le or snapshot_problem(buckets, count)
            before = self._bounds.get(key)
            if problem is None and before is not None:
                problem = bounds_change(before, bounds)
            self._bounds[key] = bounds  # the next scrape is compared with these
            if problem is not None:
                self._problems[key] = problem
                left_out.add((base, labels))
        return left_out

    def _forget_before(self, cutoff: float) -> None:
        for key in [k for k, h in self._series.items() if not h.points or h.points[-1][0] < cutoff]:
            del self._series[key]  # a series gone for the whole history (an unloaded version)
        for hist in self._series.values():
            while hist.points and hist.points[0][0] < cutoff:
                hist.points.popleft()
