"""Triton's own `/metrics`, read directly: a detector source for when Prometheus' scrape interval is
the bottleneck (docs/detectors.md says what it costs and when to turn it on).

Each query scrapes the endpoints (at most once per `min_interval` however many triggers ask), keeps
the samples in a bounded in-memory history and answers like a Prometheus range query over that
history: one series per metric and label set, with an `instance` label per endpoint. The history
lives in this process only: after a restart a detector has what was scraped since, and the
Prometheus path (which keeps history) is the one to use where that matters.
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
        return RangeResult(query, self._select(name, matchers, read, start, end), partial=errors)

    def _select(self, name: str, matchers: Mapping[str, str], urls: list[str], start: float,
                end: float) -> list[Series]:
        out = []
        for (url, sname, labels), hist in self._series.items():
            if sname not in (name, name.removesuffix("_total")) or url not in urls:
                continue
            lab = dict(labels)
            if any(lab.get(k) != v for k, v in matchers.items()):
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
            for sname, labels, value in samples:
                key = (url, sname, tuple(sorted(labels.items())))
                hist = self._series.get(key)
                if hist is None:
                    hist = self._series[key] = _History()
                hist.points.append((stamp, value))
            self._forget_before(stamp - self._history_seconds)
            return None

    def _forget_before(self, cutoff: float) -> None:
        for key in [k for k, h in self._series.items() if not h.points or h.points[-1][0] < cutoff]:
            del self._series[key]  # a series gone for the whole history (an unloaded version)
        for hist in self._series.values():
            while hist.points and hist.points[0][0] < cutoff:
                hist.points.popleft()
