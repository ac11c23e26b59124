"""A bounded open-loop load generator: KServe v2 infer requests to a local Triton at a fixed rate.

Open loop (requests leave on schedule whether or not earlier ones answered) so that a slow path
shows up as latency and queueing, the way production traffic sees it. Bounded three ways: a
request count (rate x duration), an in-flight cap, and a per-request timeout.

A `route` callable picks the model version of each request (as a mesh picks a subset by weight);
an `on_sample` callback sees every answer as it lands, for live views of the clients' latency;
an `inputs` callable gives each request its own input (a seeded generator makes a run repeatable).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class RequestSample:
    """One request: when it was sent (seconds from the start), how long it took, what answered."""

    sent_at_seconds: float
    latency_seconds: float
    status: int
    """HTTP status; 0 when no answer came (timeout or connection error)."""
    model_version: str | None
    """The version Triton says served the request, from the response body."""
    sent_at_unix: float = math.nan
    """Wall-clock send time (unix seconds), to line samples up with Prometheus and the journal."""


@dataclass
class LoadResult:
    """All samples of one load run, in send order."""

    samples: list[RequestSample] = field(default_factory=list)

    @property
    def ok(self) -> list[RequestSample]:
        """Samples answered 200."""
        return [s for s in self.samples if s.status == 200]

    @property
    def errors(self) -> list[RequestSample]:
        """Samples not answered 200."""
        return [s for s in self.samples if s.status != 200]

    @property
    def latencies_ms(self) -> list[float]:
        """Latencies of successful requests, milliseconds, in send order."""
        return [s.latency_seconds * 1000.0 for s in self.ok]

    def quantile_ms(self, q: float) -> float:
        """Nearest-rank quantile `q` (0..1) of successful latencies; NaN if there are none."""
        values = sorted(self.latencies_ms)
        if not values:
            return math.nan
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def _require_loopback(base_url: str) -> None:
    host = urlsplit(base_url).hostname
    if host not in _LOOPBACK_HOSTS:
        # The lab drives local servers only; a typo must never load a real cluster.
        raise ValueError(f"load generator only targets loopback, got {base_url!r}")


async def run_load(
    base_url: str,
    model: str = "ranker",
    rate_per_second: float = 40.0,
    duration_seconds: float = 5.0,
    max_in_flight: int = 64,
    request_timeout_seconds: float = 10.0,
    input_length: int = 4,
    route: Callable[[], str | None] | None = None,
    on_sample: Callable[[RequestSample], None] | None = None,
    inputs: Callable[[], Sequence[float]] | None = None,
) -> LoadResult:
    """Send infer requests to `model` (no version pinned) at a fixed rate for a fixed time.

    Args:
        base_url: Triton's HTTP API, e.g. ``http://127.0.0.1:8000``; must be loopback.
        model: Model name; the server picks the version, as it would for real clients.
        rate_per_second: Requests started per second.
        duration_seconds: How long to keep sending; exactly ``floor(rate x duration)`` requests.
        max_in_flight: Cap on outstanding requests; when reached, sending waits (and the
            schedule slips), so a stuck server cannot make this pile up unbounded tasks.
        request_timeout_seconds: Per-request limit; a request past it counts as status 0.
        input_length: Length of the FP32 input vector.
        route: Called once per request; a version string sends it to
            ``/v2/models/<model>/versions/<v>/infer``, None leaves the choice to the server.
        on_sample: Called with each sample as soon as its request ends (on the event loop).
        inputs: Called once per request, in send order, for its FP32 input values (their count
            replaces `input_length`); None sends `input_length` ones every time.

    Returns:
        The samples, in send order.
    """
    _require_loopback(base_url)
    total = int(rate_per_second * duration_seconds)
    interval = 1.0 / rate_per_second
    model_url = f"{base_url.rstrip('/')}/v2/models/{model}"
    body: dict[str, object] = {"inputs": [{"name": "INPUT0", "shape": [input_length], "datatype": "FP32", "data": [1.0] * input_length}]}
    slots = asyncio.Semaphore(max_in_flight)
    timeout = aiohttp.ClientTimeout(total=request_timeout_seconds)
    samples: list[RequestSample | None] = [None] * total

    def request_body() -> dict[str, object]:
        if inputs is None:
            return body
        values = [float(v) for v in inputs()]
        return {"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32", "data": values}]}

    async def one(index: int, session: aiohttp.ClientSession, start: float,
                  payload: dict[str, object]) -> None:
        sent, sent_unix = time.monotonic(), time.time()
        chosen = route() if route is not None else None
        url = f"{model_url}/versions/{chosen}/infer" if chosen else f"{model_url}/infer"
        status, version = 0, None
        try:
            async with session.post(url, json=payload) as response:
                status = response.status
                if status == 200:
                    version = (await response.json()).get("model_version")
                else:
                    await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            # Counted as an unanswered request (status 0); the run goes on.
            pass
        finally:
            slots.release()
        sample = RequestSample(sent - start, time.monotonic() - sent, status, version, sent_unix)
        samples[index] = sample
        if on_sample is not None:
            on_sample(sample)

    # The connection limit matches the in-flight cap so no request waits for a socket unseen.
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.monotonic()
        tasks: list[asyncio.Task[None]] = []
        try:
            for index in range(total):
                delay = start + index * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await slots.acquire()
                # Drawn here, in send order, so a seeded `inputs` gives request i the same values
                # whatever order the requests finish in.
                tasks.append(asyncio.create_task(one(index, session, start, request_body())))
            await asyncio.gather(*tasks)
        finally:
            # On cancellation, leave no request task behind the closed session.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return LoadResult([s for s in samples if s is not None])
