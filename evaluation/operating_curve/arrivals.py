"""Simulated requests, per step: how many took longer than the line, how many there were, and
their summed latency (what a histogram and what latency counters would show).

Two generators. Seeded runs replay the rig's arrivals request by request (a request sent at t
draws x = default_rng(seed).random(16, float32); after the defect's onset it is slow when
x[0] < share): the delay runs. Long healthy runs draw per-step Poisson counts: the false-alarm runs,
thousands of version-days.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from evaluation.operating_curve.traffic import Traffic

WARM_SECONDS = 60.0  # the rig's warm-up: draws start this long before the onset
BULK_MS = (2.0, 4.0)  # every request's own time, uniform (the rig's model sleeps 2-4 ms)


@dataclass(frozen=True)
class Fault:
    """`share` of requests take `latency_ms` (a slow path on rare inputs)."""

    share: float
    latency_ms: float

    @property
    def name(self) -> str:
        return f"{self.share:.2%} at {self.latency_ms:g} ms"


@dataclass(frozen=True)
class Steps:
    """Per step [S x P]: requests completed, those above the line, their summed latency (ms);
    and, for the naive poller, the completion time of every slow request of each row."""

    requests: NDArray[np.float64]
    above: NDArray[np.float64]
    latency_ms: NDArray[np.float64]
    slow_done: tuple[NDArray[np.float64], ...] = ()


def seeded_run(seed: int, traffic: Traffic, fault: Fault, duration: float, line_ms: float,
               step: float = 1.0, phase: float = 0.0, own_ms: tuple[float, float] = BULK_MS) -> Steps:
    """One rig-like run of `duration` seconds after the onset: a single row. `own_ms` is every
    request's own time (uniform, from x[1]); (0, 0) lands a slow request exactly `latency_ms`
    after it was sent, as the reference replay models it."""
    sent = traffic.send_times(WARM_SECONDS + duration, phase) - WARM_SECONDS
    x = np.random.default_rng(seed).random((sent.size, 16), dtype=np.float32)
    after = sent >= 0
    slow = after & (x[:, 0] < fault.share)
    own = own_ms[0] + (own_ms[1] - own_ms[0]) * x[:, 1].astype(np.float64)
    latency = own + np.where(slow, fault.latency_ms, 0.0)
    done = sent + latency / 1000.0
    cols = int(round(duration / step))
    col = np.floor(done / step).astype(np.int64)
    keep = after & (col < cols)
    requests = np.bincount(col[keep], minlength=cols).astype(np.float64)[None, :cols]
    above = np.bincount(col[keep & (latency > line_ms)], minlength=cols).astype(np.float64)[None, :cols]
    mass = np.bincount(col[keep], weights=latency[keep], minlength=cols)[None, :cols]
    return Steps(requests, above, mass, (np.sort(done[slow & (latency > line_ms)]),))


def poisson_chunk(rng: np.random.Generator, requests: NDArray[np.float64], fault: Fault,
                  line_ms: float) -> Steps:
    """Per-step Poisson counts of slow requests at `fault` among `requests` per step [S x P]; the
    bulk's summed latency as the sum of that many uniform 2-4 ms draws (its normal limit)."""
    slow = rng.poisson(requests * fault.share).astype(np.float64)
    mean_ms = 0.5 * (BULK_MS[0] + BULK_MS[1])
    sd_ms = (BULK_MS[1] - BULK_MS[0]) / np.sqrt(12.0)
    mass = requests * mean_ms + np.sqrt(requests) * sd_ms * rng.standard_normal(requests.shape)
    mass += slow * fault.latency_ms
    above = slow if fault.latency_ms > line_ms else np.zeros_like(slow)
    return Steps(requests, above, mass)
