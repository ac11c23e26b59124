"""Thresholds from a stated false-alarm rate at the observed traffic.

A CUSUM's false-alarm rate per hour at a fixed threshold grows with traffic (more requests, more
chances for a chance cluster), so a threshold is only meaningful with the traffic it was set for.
Here the policy states the rate (one false alarm per `days` per version, at the null share) and
each member's threshold is the one whose run length under the null is `days` x MEMBER_RATE_SHARE,
in steps of the detector's grid, at the requests per step it sees (run_length.py).

Traffic is placed on a 1% grid so that series of similar traffic share one computation, and the
run length is computed for a process that dominates every traffic of its grid cell: requests
above the line arrive at the cell's highest rate while the drain is the cell's lowest. A plain
rounding up is not enough: where one step's drain is several jumps (a busy series, a member made
for a large regression), a lower drain than assumed lets one step's count reach past a threshold
that sat just above the lattice of values the assumed drain allows. The domination costs ~1.5% of
threshold.
"""
from __future__ import annotations

import atexit
import math
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Hashable

import numpy as np
from numpy.typing import NDArray

from detectors.sequential.design import MEMBER_RATE_SHARE, BankDesign
from detectors.sequential.run_length import run_length, threshold_for

TRAFFIC_GRID = 1.01  # requests per step placed in cells between powers of this
DAY_SECONDS = 86_400.0


@dataclass(frozen=True)
class Promise:
    """The false-alarm rate a detector runs at: one per `days` version-days at the design's null."""

    days: float
    step_seconds: float

    def __post_init__(self) -> None:
        if self.days <= 0 or self.step_seconds <= 0:
            raise ValueError(f"days and step_seconds must be positive: {self}")

    @property
    def steps(self) -> float:
        """The mean run length under the null, in steps, that the promise asks of the bank."""
        return self.days * DAY_SECONDS / self.step_seconds


def rounded_traffic(requests_per_step: float) -> float:
    """The top of the traffic grid cell that holds `requests_per_step` (0 stays 0)."""
    if requests_per_step <= 0 or not math.isfinite(requests_per_step):
        return 0.0
    return float(TRAFFIC_GRID ** math.ceil(math.log(requests_per_step) / math.log(TRAFFIC_GRID)))


NO_CELL = np.iinfo(np.int64).min
"""`traffic_cells` of a value that rounds to 0 traffic (none, or not a number)."""


def traffic_cells(requests_per_step: NDArray[np.float64]) -> NDArray[np.int64]:
    """`rounded_traffic`'s cell of every value at once, as the exponent of its top (NO_CELL where
    it rounds to 0): the same cell as the scalar rule for every value, since values whose quotient
    sits within 1e-9 of a cell edge, where numpy's log and math's may round apart, take the scalar rule."""
    t = np.asarray(requests_per_step, dtype=np.float64)
    valid = np.isfinite(t) & (t > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.log(np.where(valid, t, 1.0)) / math.log(TRAFFIC_GRID)
    cells: NDArray[np.int64] = np.ceil(q).astype(np.int64)
    for i in np.flatnonzero(valid & (np.abs(q - np.rint(q)) < 1e-9)).tolist():
        cells[i] = math.ceil(math.log(float(t[i])) / math.log(TRAFFIC_GRID))
    cells[~valid] = NO_CELL
    return cells


def thresholds(design: BankDesign, promise: Promise, requests_per_step: float,
               member_share: float = MEMBER_RATE_SHARE) -> tuple[float, ...]:
    """Each member's threshold for `promise` at any traffic of the grid cell of `requests_per_step`."""
    return _thresholds(design, promise, rounded_traffic(requests_per_step), member_share)


@lru_cache(maxsize=4096)
def _thresholds(design: BankDesign, promise: Promise, traffic: float, member_share: float) -> tuple[float, ...]:
    mean = traffic * design.events  # the cell's highest arrival rate ...
    lowest = traffic / TRAFFIC_GRID  # ... and its lowest drain
    members = [(jump, lowest * drain) for jump, drain in zip(design.chain_jumps, design.drains)]
    budget = 1.0 / (promise.steps * member_share)  # false alarms per step, each member
    # A step's requests vary (Poisson about the cell's traffic; a diurnal day moves the mean within
    # the lookback): a member made for a large regression crosses on one step's count, and a step
    # with fewer requests than the mean drains less, so its chain is solved over the requests' spread.
    step = design.per_step
    h = [threshold_for(1.0 / budget, jump, drain, mean, requests=traffic, per_step=step) for jump, drain in members]
    # Such a member lives on a lattice (one step's count either reaches its threshold or is drained
    # away): the lowest threshold that keeps its rate often leaves most of its budget unused. What
    # such members leave goes to the members that use theirs.
    used = [1.0 / run_length(hk, jump, drain, mean, requests=traffic, per_step=step) for hk, (jump, drain) in zip(h, members)]
    thrifty = [u < 0.8 * budget for u in used]
    spare = sum(budget - u for u, t in zip(used, thrifty) if t)
    full = thrifty.count(False)
    if full and spare > 0:
        more = budget + spare / full
        h = [hk if t else threshold_for(1.0 / more, *m, mean, hint=hk - math.log(more / budget), requests=traffic,
                                        per_step=step)
             for hk, t, m in zip(h, thrifty, members)]
    return tuple(h)


def single_threshold(null: float, alternative: float, promise: Promise, requests_per_step: float) -> float:
    """The threshold of one CUSUM of `null` against `alternative` (shares of requests) for
    `promise`, traffic not rounded: the limit, the test that knows the true rates."""
    ratio = alternative / null
    return threshold_for(promise.steps, math.log(ratio), requests_per_step * null * (ratio - 1.0),
                         requests_per_step * null)


def wald_thresholds(design: BankDesign, promise: Promise, member_share: float = MEMBER_RATE_SHARE) -> tuple[float, ...]:
    """Thresholds that hold the promise at any traffic, before the run lengths are computed: with
    theta the member's Lundberg exponent, exp(theta S) is a supermartingale under the null, so a
    cycle from zero reaches h with probability at most exp(-theta h) (Wald), and every cycle lasts
    at least a step: a run length of at least exp(theta h) steps. Several nats higher than the
    chain's (slower), never looser."""
    steps = math.log(promise.steps * member_share)
    return tuple(steps / theta for theta in _exponents(design))


@lru_cache(maxsize=256)
def _exponents(design: BankDesign) -> tuple[float, ...]:
    return design.exponents()


Derive = Callable[[], tuple[float, ...]]
"""A cell's derivation (or its stand-in), run by `ThresholdStore`'s worker."""


class ThresholdStore:
    """Thresholds derived in the background, shared by every detector of the process.

    A detector asks for its traffic cells each cycle; a cell not derived yet answers the Wald
    thresholds (safe, slower) and is queued; one worker thread derives the queue (a cell takes
    a fraction of a second, and a fleet's first cycle may meet hundreds of cells), never the
    event loop. Other bounds a detector derives per cell (the canary's start bounds) ride the
    same queue through `cell`, so `wait` covers them too."""

    def __init__(self) -> None:
        self._done: dict[Hashable, tuple[float, ...]] = {}
        self._queue: list[tuple[Hashable, Derive, Derive]] = []  # (key, derivation, its safe stand-in)
        self._queued: set[Hashable] = set()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._closing = False
        self.failures = 0  # cells whose derivation raised (they keep their stand-in: Wald's thresholds)
        # A daemon thread still deriving while the interpreter finalizes breaks its last flush of
        # stdout (exit status 120 after a clean run): the process's exit waits for the cell in hand.
        atexit.register(self.close)

    def get(self, design: BankDesign, promise: Promise, requests_per_step: float,
            member_share: float = MEMBER_RATE_SHARE) -> tuple[tuple[float, ...], bool]:
        """(thresholds, derived): the cell's derived thresholds, else the Wald ones (queued)."""
        key = (design, promise, rounded_traffic(requests_per_step), member_share)
        found = self._done.get(key)
        if found is not None:
            return found, True
        return self.cell(key, lambda: _thresholds(*key), lambda: wald_thresholds(design, promise, member_share))

    def cell(self, key: Hashable, derive: Derive, stand_in: Derive) -> tuple[tuple[float, ...], bool]:
        """(values, derived): the cell's derived values, else `stand_in()`'s (a bound that holds
        everywhere, looser) while `derive` is queued for the worker; a derivation that raises keeps
        the stand-in, counted in `failures`."""
        found = self._done.get(key)
        if found is not None:
            return found, True
        with self._lock:
            if key not in self._queued and not self._closing:
                self._queued.add(key)
                self._queue.append((key, derive, stand_in))
                if self._worker is None or not self._worker.is_alive():
                    self._worker = threading.Thread(target=self._drain, name="tailguard-thresholds", daemon=True)
                    self._worker.start()
        return stand_in(), False

    def derive_now(self, design: BankDesign, promise: Promise, requests_per_step: float,
                   member_share: float = MEMBER_RATE_SHARE) -> tuple[float, ...]:
        """The cell's thresholds, derived in this thread if need be (tests, benchmarks, backtest)."""
        key = (design, promise, rounded_traffic(requests_per_step), member_share)
        if key not in self._done:
            self._done[key] = _thresholds(*key)
        return self._done[key]

    def wait(self, timeout: float = 300.0) -> bool:
        """Wait until the queue is derived (tests; a shared 2-core machine under load has taken over
        60 s); whether it was within `timeout`."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
        return not self._queue

    def close(self, timeout: float = 30.0) -> None:
        """Derive no further cell and wait for the one in hand (at exit); cells asked later answer
        Wald's thresholds."""
        with self._lock:
            self._closing = True
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue or self._closing:
                    return
                key, derive, stand_in = self._queue[0]
            try:
                self._done[key] = derive()
            except Exception:  # a cell that cannot be derived keeps its stand-in (Wald's thresholds), counted
                self.failures += 1
                self._done[key] = stand_in()
            with self._lock:
                self._queue.pop(0)
                self._queued.discard(key)


STORE = ThresholdStore()
"""The process's thresholds (detectors share cells: two policies on similar traffic derive once)."""
