"""Prometheus queries through prometheus-api-client, kept off the event loop (it is blocking)."""
from __future__ import annotations

import asyncio
import math
from datetime import datetime, timezone
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from core.query import QueryResult, Sample, Series


MALFORMED = (PrometheusApiClientException, requests.RequestException, ValueError, KeyError, TypeError,
             IndexError, AttributeError)
"""What a failed or malformed answer raises (an answer of 200 without `data`: KeyError; `data` not an
object, points not pairs: TypeError, IndexError, ValueError): each is the query's error, never the poller's."""

INGESTING = 1.0
"""Seconds a range ends behind the clock: Prometheus stamps a scrape with the time it began and
commits its samples once it has read it whole, so a query and its companion (two answers) evaluated
where a scrape is still being read may straddle it: a new count over an old bucket, a healthy model
fires. A scrape shorter than this is in both answers or in neither. A backtest's replay of stored
history has none (`ReplayPrometheus.ingesting`)."""


class RangeResult:
    """A range query's answer: series, or an error. Empty series means no data. `partial` names the
    sources that could not be read when others were (source: triton, one replica unreachable): the
    series are those of the sources read."""

    def __init__(self, query: str, series: list[Series] | None = None, error: str | None = None,
                 partial: tuple[str, ...] = ()) -> None:
        self.query = query
        self.series = series or []
        self.error = error
        self.partial = partial

    @property
    def no_data(self) -> bool:
        return self.error is None and not self.series


class PrometheusClient:
    """One client (one HTTP session) per Prometheus for the daemon's lifetime."""

    ingesting = INGESTING  # how far behind the clock its ranges end

    def __init__(self, url: str, timeout_seconds: float = 10.0) -> None:
        # Retries are the poller's business (with backoff and staleness), not the HTTP adapter's.
        self._api = PrometheusConnect(url=url, retry=Retry(total=0), timeout=timeout_seconds,
                                      method="POST")
        self.url = url

    def close(self) -> None:
        self._api.close()

    async def query(self, promql: str) -> QueryResult:
        """Instant query -> QueryResult (samples / no data / error); never raises for remote errors."""
        try:
            data = await asyncio.to_thread(self._api.custom_query, promql)
            samples = []
            for item in data:
                if "value" not in item:
                    continue
                value = float(item["value"][1])
                if math.isnan(value):
                    continue  # NaN (e.g. 0/0 rates) is no data, never a healthy zero
                samples.append(Sample(dict(item.get("metric", {})), value))
        except MALFORMED as exc:
            return QueryResult(promql, error=f"{type(exc).__name__}: {exc}")
        return QueryResult(promql, tuple(samples))

    async def query_range(self, promql: str, start: float, end: float, step_seconds: float) -> RangeResult:
        """Range query -> series with float arrays; NaN points are kept for detectors to judge."""
        try:
            data = await asyncio.to_thread(
                self._api.custom_query_range, promql,
                datetime.fromtimestamp(start, timezone.utc), datetime.fromtimestamp(end, timezone.utc),
                # Plain seconds: Prometheus reads a float there, while a duration ("1.5s") must be whole units.
                f"{max(step_seconds, 0.001):g}",
            )
            stamps: dict[tuple[Any, ...], tuple[float, ...]] = {}
            series = [_series(item, stamps) for item in data]
        except MALFORMED as exc:
            return RangeResult(promql, error=f"malformed or failed answer: {type(exc).__name__}: {exc}")
        return RangeResult(promql, series)


def _series(item: dict[str, Any], stamps: dict[tuple[Any, ...], tuple[float, ...]]) -> Series:
    """One matrix entry (`{"metric": {...}, "values": [[t, "v"], ...]}`) as a Series of floats.

    The points are split by `zip` and converted by `map`, in C, where a generator per column ran
    Python code per point. `stamps` holds the timestamps tuples of the answer so far: series with
    the same timestamps (nearly all of a range answer) share one tuple, converted once, which
    `align` and the range cache then also handle once."""
    points = item.get("values", [])
    raw_stamps, raw_values = zip(*points) if points else ((), ())
    timestamps = stamps.get(raw_stamps)
    if timestamps is None:
        timestamps = stamps[raw_stamps] = tuple(map(float, raw_stamps))
    return Series(dict(item.get("metric", {})), timestamps, tuple(map(float, raw_values)))
