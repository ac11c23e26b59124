"""Run deciders over simulated traffic: delay runs (seeded, one row each) and false-alarm runs
(thousands of version-days at once, in chunks of columns)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
from numpy.typing import NDArray
from scipy.stats import chi2

from evaluation.operating_curve.arrivals import Fault, Steps, poisson_chunk, seeded_run
from evaluation.operating_curve.deciders import Decider, Naive, Run
from evaluation.operating_curve.traffic import DAY, Traffic


@runtime_checkable
class Warmed(Run, Protocol):
    """A run whose front end reads history before its first step (given it, never tested on it)."""

    def warm(self, steps: Steps) -> None: ...


def phase_of(seed: int) -> float:
    """A seeded run's time of day on a diurnal trace."""
    return float(np.random.default_rng(10_000 + seed).uniform(0, DAY))


HISTORY_SECONDS = 720.0
"""A seeded run's version served this long before the onset, at half budget (0.05% at 900 ms):
what a decider's front end reads behind its first step (the counting's bulk and sub-line windows,
detectors/_slow_counts.py); no decider's test sees it."""


def history(seed: int, traffic: Traffic, line_ms: float, step: float = 1.0) -> Steps:
    """The healthy steps before a seeded run's onset (one row; Poisson counts, its own seed)."""
    cols = int(round(HISTORY_SECONDS / step))
    t = (np.arange(cols) - cols) * step
    requests = traffic.rate(t[None, :], phase_of(seed) if traffic.swing else 0.0) * step
    return poisson_chunk(np.random.default_rng(50_000 + seed), requests, Fault(0.0005, 900), line_ms)


def delays(deciders: Sequence[Decider], traffic: Traffic, fault: Fault, seeds: Sequence[int], horizon: float,
           line_ms: float, step: float = 1.0) -> dict[str, NDArray[np.float64]]:
    """Seconds from the onset to each decider's first alarm, per seed (NaN: not within `horizon`).
    A decider that reads history behind its first step (`warm`) is given HISTORY_SECONDS of it."""
    out: dict[str, list[float]] = {d.name: [] for d in deciders}
    for seed in seeds:
        steps = seeded_run(seed, traffic, fault, horizon, line_ms, step, phase_of(seed) if traffic.swing else 0.0)
        before = None
        for d in deciders:
            run = d.start(1)
            if isinstance(run, Warmed):
                before = before if before is not None else history(seed, traffic, line_ms, step)
                run.warm(before)
            run.feed(steps)
            out[d.name].append(float(run.first[0]))
    return {name: np.array(v) for name, v in out.items()}


@dataclass(frozen=True)
class Rate:
    """False alarms over `days` version-days, and whether they hold a stated rate per day."""

    alarms: int
    days: float

    @property
    def per_day(self) -> float:
        return self.alarms / self.days

    @property
    def lower(self) -> float:
        """The Poisson 95% lower bound of the rate per day."""
        return 0.0 if self.alarms == 0 else float(chi2.ppf(0.025, 2 * self.alarms) / 2) / self.days

    def holds(self, stated: float) -> bool:
        """The definition: the 95% lower bound at most the stated rate, the estimate at most 1.2x."""
        return self.lower <= stated and self.per_day <= 1.2 * stated


def false_alarms(deciders: Sequence[Decider], traffic: Traffic, fault: Fault, days: int, line_ms: float,
                 step: float = 1.0, chunk_seconds: float = 1800.0, seed: int = 1) -> dict[str, Rate]:
    """Alarms of each decider over `days` simulated version-days of healthy traffic, each row a
    version that runs a whole day (a diurnal row starts at its own time of day)."""
    rng = np.random.default_rng(seed)
    phases = rng.uniform(0, DAY, days) if traffic.swing else np.zeros(days)
    runs = [d.start(days) for d in deciders]
    cols = int(round(chunk_seconds / step))
    for lo in range(0, int(round(DAY / step)), cols):
        t = (lo + np.arange(cols)) * step
        requests = traffic.rate(t[None, :], phases[:, None]) * step
        steps = poisson_chunk(rng, requests, fault, line_ms)
        for run in runs:
            run.feed(steps)
    return {d.name: Rate(int(r.alarms.sum()), float(days)) for d, r in zip(deciders, runs)}


def median_delay(values: NDArray[np.float64]) -> float:
    """The median with runs that did not detect counted as never (inf when half or more did not)."""
    return float(np.median(np.where(np.isnan(values), math.inf, values)))


def detected(values: NDArray[np.float64]) -> float:
    return float(np.mean(~np.isnan(values)))


def tune_naive(traffic: Traffic, fault: Fault, days: int, line_ms: float, stated: float,
               step: float = 1.0, largest: int = 64) -> int:
    """The smallest N whose naive poller's false-alarm estimate is at most the stated rate (its
    rate falls as N grows: a bisection over N, each step a whole run of version-days)."""
    lo, hi = 1, largest  # rate(lo) > stated is assumed at N = 1; rate(hi) <= stated checked below
    if false_alarms([Naive(hi, step)], traffic, fault, days, line_ms, step, seed=2)[Naive(hi, step).name].per_day > stated:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        naive = Naive(mid, step)
        if false_alarms([naive], traffic, fault, days, line_ms, step, seed=2)[naive.name].per_day <= stated:
            hi = mid
        else:
            lo = mid
    return hi
