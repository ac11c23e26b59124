"""Two versions side by side: the canary benchmark's traffic (bench/bench_canary.py).

A route sends `weight` of the requests to the canary and the rest to the stable; each version has
its own share of slow requests. Two generators, as in arrivals.py:

- seeded runs replay the rig's arrivals: a request sent at t draws x = default_rng(seed).random(16,
  float32); it is slow when x[0] < its version's share and takes 2-4 ms of its own (x[1]). Once the
  canary serves, the route sends it every (1 / weight)-th request, an even split (Envoy picks a
  weighted destination at random per request; that changes how many requests a step carries, not
  what share of them is slow, and an even split keeps the canary's traffic in one cell of the
  live detector's threshold grid, where a random one makes the first minutes of every run visit
  dozens, each a threshold derivation). One row per seed: the delay runs.
- version-day runs: each version's requests per step on a fixed schedule (the load generators send
  evenly; a random phase per row), the slow ones Binomial per step, and each minute's P99.9 drawn
  from the order statistics of that minute's requests (2-4 ms each, the slow ones 900 ms more):
  thousands of version-days at once, for the false verdicts.

Steps are scored as the live detector scores a histogram's (detectors/sequential/evidence.py,
`count_evidence`): a step without a request is not a step of the test (NaN). Times are seconds
from the onset; a decider's run is fed the same chunks (`PairRun.feed`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Protocol

import numpy as np
from numpy.typing import NDArray

from evaluation.operating_curve.arrivals import BULK_MS, WARM_SECONDS, Fault, Steps
from evaluation.operating_curve.traffic import DAY, Traffic

MINUTE = 60.0
QUANTILE = 0.999
HALF_BUDGET = Fault(0.0005, 900)


@dataclass(frozen=True)
class Split:
    """`traffic` req/s in all, `weight` of it to the canary once it serves (1 / weight a whole number)."""

    traffic: float
    weight: float

    def __post_init__(self) -> None:
        if abs(1.0 / self.weight - round(1.0 / self.weight)) > 1e-9:
            raise ValueError(f"weight {self.weight}: the even split sends every (1 / weight)-th request")

    @property
    def name(self) -> str:
        return f"{self.weight:.0%} of {self.traffic:g} req/s"

    @property
    def canary_rate(self) -> float:
        return self.traffic * self.weight

    @property
    def stable_rate(self) -> float:
        return self.traffic * (1.0 - self.weight)


@dataclass(frozen=True)
class Case:
    """What each version's slow requests are after the onset (before it, and outside a version-day's
    episode, both are at `before`)."""

    name: str
    kind: str  # "defect": the canary is at fault; "healthy", "shared": no verdict is right
    stable: Fault
    canary: Fault
    before: Fault = HALF_BUDGET


@dataclass(frozen=True)
class PairSteps:
    """One chunk of both versions: per step (NaN: not scored) and per minute (P99.9 in ms, NaN: no
    request). `column` is the first step's column and `minute` the first minute's, both counted
    from the onset; `canary_start` the column where the canary began serving."""

    stable: Steps
    canary: Steps
    stable_p999: NDArray[np.float64]
    canary_p999: NDArray[np.float64]
    column: int
    minute: int
    canary_start: int
    step: float = 1.0

    @property
    def cols(self) -> int:
        return int(self.stable.requests.shape[1])


def scored(above: NDArray[np.float64], requests: NDArray[np.float64]) -> Steps:
    """Per-step counts as the live test scores them: a step without a request is not a step."""
    ok = requests > 0
    return Steps(np.where(ok, requests, np.nan), np.where(ok, above, np.nan), np.full(requests.shape, np.nan))


# ---- seeded runs: the rig's arrivals, request by request ----------------------------------------


def seeded_pair(seed: int, split: Split, case: Case, duration: float, history: float, line_ms: float,
                step: float = 1.0, canary_start: float = 0.0, block: int = 1 << 18) -> PairSteps:
    """One row from `history` seconds before the onset to `duration` after it; the canary serves
    from `canary_start` (before it the stable takes every request)."""
    if history % MINUTE or duration % MINUTE:
        raise ValueError("history and duration are whole minutes")
    sent = Traffic(split.traffic).send_times(WARM_SECONDS + history + duration) - WARM_SECONDS - history
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.random((min(block, sent.size - lo), 16), dtype=np.float32)[:, :2]
                        for lo in range(0, sent.size, block)]) if sent.size else np.zeros((0, 2), np.float32)
    period = int(round(1.0 / split.weight))
    canary = (sent >= canary_start) & (np.arange(sent.size) % period == period - 1)
    after = sent >= 0
    share = np.where(canary, np.where(after, case.canary.share, case.before.share),
                     np.where(after, case.stable.share, case.before.share))
    slow_ms = np.where(canary, np.where(after, case.canary.latency_ms, case.before.latency_ms),
                       np.where(after, case.stable.latency_ms, case.before.latency_ms))
    slow = x[:, 0] < share
    latency = BULK_MS[0] + (BULK_MS[1] - BULK_MS[0]) * x[:, 1].astype(np.float64) + np.where(slow, slow_ms, 0.0)
    done = sent + latency / 1000.0
    first = -int(round(history / step))
    cols = int(round((history + duration) / step))
    col = np.floor(done / step).astype(np.int64) - first
    keep = (sent >= -history) & (col >= 0) & (col < cols)
    minutes = int(round((history + duration) / MINUTE))
    minute = np.floor(done / MINUTE).astype(np.int64) + int(round(history / MINUTE))
    out: list[Steps] = []
    quantiles: list[NDArray[np.float64]] = []
    for version in (~canary, canary):
        v = keep & version
        requests = np.bincount(col[v], minlength=cols).astype(np.float64)[None, :cols]
        above = np.bincount(col[v & (latency > line_ms)], minlength=cols).astype(np.float64)[None, :cols]
        out.append(scored(above, requests))
        quantiles.append(_minute_quantiles(minute[v], latency[v], minutes)[None, :])
    return PairSteps(out[0], out[1], quantiles[0], quantiles[1], first, -int(round(history / MINUTE)),
                     int(math.floor(canary_start / step)), step)


def _minute_quantiles(minute: NDArray[np.int64], latency: NDArray[np.float64], minutes: int) -> NDArray[np.float64]:
    """np.quantile(..., QUANTILE) of each minute's latencies (NaN: none)."""
    inside = (minute >= 0) & (minute < minutes)
    minute, latency = minute[inside], latency[inside]
    order = np.argsort(minute, kind="stable")
    minute, latency = minute[order], latency[order]
    edges = np.searchsorted(minute, np.arange(minutes + 1))
    out = np.full(minutes, np.nan)
    for m in range(minutes):
        if edges[m + 1] > edges[m]:
            out[m] = np.quantile(latency[edges[m]:edges[m + 1]], QUANTILE)
    return out


# ---- version-day runs: per-step counts and per-minute order statistics ---------------------------


def schedule(rate: float, phase: NDArray[np.float64], first: int, cols: int, step: float) -> NDArray[np.float64]:
    """Requests per step of an even schedule at `rate` req/s, per row its own `phase` in [0, 1)."""
    edges = (first + np.arange(cols + 1)) * step * rate + phase[:, None]
    return np.diff(np.floor(edges), axis=1)


def minute_quantile(rng: np.random.Generator, n: NDArray[np.int64], k: NDArray[np.int64],
                    slow_ms: NDArray[np.float64] | float = 900.0, q: float = QUANTILE) -> NDArray[np.float64]:
    """The q-quantile (numpy's linear rule) of a minute of `n` requests, `k` of them slow: drawn
    from the order statistics of n - k own times (uniform 2-4 ms) and k slow ones (`slow_ms` more)."""
    n, k = np.asarray(n, dtype=np.int64), np.asarray(k, dtype=np.int64)
    slow = np.broadcast_to(np.asarray(slow_ms, dtype=np.float64), n.shape)
    out = np.full(n.shape, np.nan)
    pos = q * (n - 1)
    i = np.floor(pos).astype(np.int64)
    f = pos - i
    m = n - k
    lo_ms, span = BULK_MS[0], BULK_MS[1] - BULK_MS[0]
    one = n == 1
    out[one] = lo_ms + span * rng.random(int(one.sum())) + np.where(k[one] > 0, slow[one], 0.0)
    many = n >= 2

    def pair(rank: NDArray[np.int64], size: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The (rank+1)-th and (rank+2)-th smallest of `size` uniforms on [0, 1)."""
        a = rng.beta(rank + 1, size - rank)
        return a, a + (1.0 - a) * rng.beta(1, size - rank - 1)

    bulk = many & (i + 1 <= m - 1)  # both neighbours are own times
    a, b = pair(i[bulk], m[bulk])
    out[bulk] = lo_ms + span * (a + f[bulk] * (b - a))
    edge = many & (i == m - 1) & (m >= 1)  # the slowest own time and the fastest slow request
    a, b = rng.beta(m[edge], 1), rng.beta(1, k[edge])
    lo, hi = lo_ms + span * a, slow[edge] + lo_ms + span * b
    out[edge] = lo + f[edge] * (hi - lo)
    tail = many & (i >= m)  # both slow
    a, b = pair(i[tail] - m[tail], k[tail])
    out[tail] = slow[tail] + lo_ms + span * (a + f[tail] * (b - a))
    return out


def version_days(rng: np.random.Generator, rows: int, split: Split, case: Case, history: float, line_ms: float,
                 step: float = 1.0, chunk_seconds: float = 3600.0, episode_seconds: float | None = None
                 ) -> Iterator[PairSteps]:
    """`rows` version-days in chunks: the canary serves from column 0 for a whole day, the stable
    from `history` seconds before. Without `episode_seconds` both versions are at the case's
    shares all day; with it, at `before` except for one episode of that length per row, at a
    random time of the day (a shared slowdown starts and ends while both serve)."""
    if history % MINUTE or chunk_seconds % MINUTE:
        raise ValueError("history and chunks are whole minutes")
    phases = rng.random((2, rows))
    if episode_seconds is None:
        onset, end = np.full(rows, -np.inf), np.full(rows, np.inf)
    else:
        onset = rng.uniform(0.0, DAY - episode_seconds, rows)
        end = onset + episode_seconds
    per_step = int(round(MINUTE / step))
    first = -int(round(history / step))
    cols = int(round(chunk_seconds / step))
    for lo in range(first, int(round(DAY / step)), cols):
        width = min(cols, int(round(DAY / step)) - lo)
        t = (lo + np.arange(width)) * step
        inside = (t[None, :] >= onset[:, None]) & (t[None, :] < end[:, None])
        versions: list[Steps] = []
        quantiles: list[NDArray[np.float64]] = []
        for index, (rate, fault) in enumerate(((split.stable_rate, case.stable), (split.canary_rate, case.canary))):
            requests = schedule(rate, phases[index], lo, width, step)
            if index == 1:
                requests[:, t < 0] = 0.0  # the canary serves from column 0
            share = np.where(inside, fault.share, case.before.share)
            latency = np.where(inside, fault.latency_ms, case.before.latency_ms)
            slow = rng.binomial(requests.astype(np.int64), share).astype(np.float64)
            above = np.where(latency > line_ms, slow, 0.0)
            versions.append(scored(above, requests))
            n = requests.reshape(rows, -1, per_step).sum(axis=2).astype(np.int64)
            k = slow.reshape(rows, -1, per_step).sum(axis=2).astype(np.int64)
            heavy = latency.reshape(rows, -1, per_step).max(axis=2)
            quantiles.append(np.where(n > 0, minute_quantile(rng, np.maximum(n, 1), k, heavy), np.nan))
        yield PairSteps(versions[0], versions[1], quantiles[0], quantiles[1], lo, lo // per_step, 0, step)


# ---- the deciders ---------------------------------------------------------------------------------


class PairRun(Protocol):
    alarms: NDArray[np.int64]
    first: NDArray[np.float64]

    def feed(self, pair: PairSteps) -> None: ...


class PairDecider(Protocol):
    name: str

    def start(self, rows: int) -> PairRun: ...
