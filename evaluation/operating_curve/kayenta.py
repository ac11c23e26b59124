"""A Kayenta-style canary judge: each minute, `scipy.stats.mannwhitneyu` (one-sided, the canary
greater; scipy's default method) on the per-minute P99.9 of the last 10 minutes of each version
(the canary's since it started while it is younger), failing at p < alpha.

Its alpha is tuned (`tune_alpha`) to the same false-verdict rate as the judge on healthy pairs at
half budget, where it can reach it: with 10 minutes a side the smallest p the test can give is
bounded, so a rate below what that p allows cannot be had at any alpha (the bench says so). The
judge also promises a share per canary start; `start_alpha_cap` is the largest alpha that keeps it
on healthy starts, a cap for the tuning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray
from scipy.stats import mannwhitneyu

from evaluation.operating_curve.arrivals import Fault, Steps
from evaluation.operating_curve.deciders import Clocked, _Clock
from evaluation.operating_curve.pairs import HALF_BUDGET, MINUTE, PairSteps, Split, minute_quantile
from evaluation.operating_curve.traffic import DAY

@dataclass(frozen=True)
class MannWhitney:
    """Kayenta-style: per-minute P99.9 of each version's last `minutes` minutes, tested each minute."""

    alpha: float
    minutes: int = 10
    label: str = "Mann-Whitney"

    @property
    def name(self) -> str:
        return self.label

    def start(self, rows: int) -> "MannWhitneyRun":
        nan = np.full((rows, self.minutes - 1), np.nan)
        return MannWhitneyRun(self, _Clock(rows, MINUTE), nan.copy(), nan.copy(),
                              np.full(rows, np.iinfo(np.int64).min))


def mw_pvalues(stable: NDArray[np.float64], canary: NDArray[np.float64], minutes: int) -> NDArray[np.float64]:
    """p of "the canary's per-minute P99.9 is greater" for each column of [R x M] minute values whose
    `minutes - 1` first columns are the history: the last `minutes` minutes of each version, the
    canary's NaN-free tail (a canary younger than the window); NaN: no canary minute (or a stable
    one missing)."""
    sw = sliding_window_view(stable, minutes, axis=1)
    cw = sliding_window_view(canary, minutes, axis=1)
    valid = np.isfinite(cw)
    age = valid.sum(axis=2)
    # The canary's minutes are the last `age` of its window (it serves from some minute on).
    out = np.full(age.shape, np.nan)
    whole = np.isfinite(sw).all(axis=2)
    for a in range(1, minutes + 1):
        at = (age == a) & whole & valid[:, :, -a:].all(axis=2)
        if at.any():
            out[at] = mannwhitneyu(cw[at][:, -a:], sw[at], alternative="greater", axis=-1).pvalue
    return out


@dataclass
class MannWhitneyRun(Clocked):
    spec: MannWhitney
    clock: _Clock
    stable_tail: NDArray[np.float64]
    canary_tail: NDArray[np.float64]
    since: NDArray[np.int64]  # per row, the first minute of the current canary
    pvalues: list[NDArray[np.float64]] = field(default_factory=list)  # kept when asked (tuning)
    keep: bool = False

    def feed(self, pair: PairSteps) -> None:
        k = self.spec.minutes - 1
        stable = np.hstack([self.stable_tail, pair.stable_p999])
        canary = np.hstack([self.canary_tail, pair.canary_p999])
        minutes = pair.minute - k + np.arange(stable.shape[1])
        p = mw_pvalues(stable, canary, self.spec.minutes)
        if self.keep:
            self.pvalues.append(p)
        fail = p < self.spec.alpha
        pending = np.flatnonzero(fail.any(axis=1))
        while pending.size:
            first = np.argmax(fail[pending], axis=1)
            at = minutes[k + first]
            self.clock.record(pending, at)
            self.since[pending] = at + 1
            canary[pending] = np.where(minutes[None, :] > at[:, None], canary[pending], np.nan)
            again = mw_pvalues(stable[pending], canary[pending], self.spec.minutes)
            fail[pending] = again < self.spec.alpha
            more = fail[pending].any(axis=1)
            pending = pending[more]
        self.stable_tail, self.canary_tail = stable[:, -k:].copy(), canary[:, -k:].copy()



def minute_days(rng: np.random.Generator, rows: int, split: Split, fault: Fault, history_minutes: int,
                served_minutes: int = int(DAY / MINUTE)) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-minute P99.9 of both versions at `fault` over `served_minutes` of the canary (a whole
    version-day unless told), the canary from minute `history_minutes` on: what the Mann-Whitney
    judge reads, without the steps."""
    minutes = history_minutes + served_minutes
    out = []
    for index, rate in enumerate((split.stable_rate, split.canary_rate)):
        n = np.full((rows, minutes), int(round(rate * MINUTE)), dtype=np.int64)
        if index == 1:
            n[:, :history_minutes] = 0
        k = rng.binomial(n, fault.share)
        out.append(np.where(n > 0, minute_quantile(rng, np.maximum(n, 1), k, fault.latency_ms), np.nan))
    return out[0], out[1]


def minutes_only(stable: NDArray[np.float64], canary: NDArray[np.float64], minute: int) -> PairSteps:
    """Per-minute values without steps (what the Mann-Whitney judge reads), from `minute` on."""
    none = np.zeros((stable.shape[0], 0))
    return PairSteps(Steps(none, none, none), Steps(none, none, none), stable, canary, 0, minute, 0)


def healthy_days(split: Split, days: int, history_minutes: int, seed: int, block: int
                 ) -> Iterator[tuple[NDArray[np.float64], NDArray[np.float64]]]:
    """`days` healthy version-days at half budget in blocks of `block` rows, seeded per block."""
    for lo in range(0, days, block):
        rng = np.random.default_rng([seed, lo])
        yield minute_days(rng, min(block, days - lo), split, HALF_BUDGET, history_minutes)


def start_lowest_p(split: Split, starts: int, window_seconds: float, minutes: int = 10, seed: int = 3,
                   block: int = 5000) -> NDArray[np.float64]:
    """The smallest p each of `starts` healthy canary starts (both versions at half budget) gets in
    its first `window_seconds`, sorted: at alpha, `verdicts_below(lowest, alpha)` of them get a
    verdict there."""
    k = minutes - 1
    served = int(math.ceil(window_seconds / MINUTE))
    lowest = []
    for lo in range(0, starts, block):
        rng = np.random.default_rng([seed, lo])
        stable, canary = minute_days(rng, min(block, starts - lo), split, HALF_BUDGET, k, served)
        lowest.append(np.nanmin(mw_pvalues(stable, canary, minutes), axis=1))
    return np.sort(np.concatenate(lowest))


def verdicts_below(lowest: NDArray[np.float64], alpha: float) -> int:
    """How many starts of `start_lowest_p` get a verdict at alpha (p < alpha)."""
    return int(np.searchsorted(lowest, alpha, side="left"))


def start_alpha_cap(lowest: NDArray[np.float64], share: float) -> float:
    """The largest alpha at which at most `share` of the starts get a verdict: the judge's promise
    per start (its start test's `start_false_verdicts` plus the running bank's share of the window),
    which an alpha tuned on version-days alone does not keep, since it spends its false verdicts
    where a young canary's two or three minutes give a small p."""
    allowed = int(share * lowest.size)
    return float(lowest[allowed]) if allowed < lowest.size else 1.0  # ties at it only lower the count


def tune_alpha(split: Split, days: int, stated: float, minutes: int = 10, cap: float = 0.05, seed: int = 2,
               block: int = 500) -> tuple[float, int, float]:
    """The largest alpha (at most `cap`) whose Mann-Whitney judge's false verdicts over `days`
    version-days at half budget are at most the stated rate; with the verdicts at that alpha, and
    the smallest p-value seen (the least alpha could be). Verdicts restart the canary's window."""
    k = minutes - 1
    blocks = [(stable, canary, mw_pvalues(stable, canary, minutes))
              for stable, canary in healthy_days(split, days, k, seed, block)]
    smallest = float(min(np.nanmin(p) for _, _, p in blocks))
    allowed = stated * days

    def verdicts(alpha: float) -> int:
        total = 0
        for stable, canary, p in blocks:
            rows = np.flatnonzero((p < alpha).any(axis=1))
            if rows.size:
                run = MannWhitney(alpha, minutes).start(rows.size)
                run.feed(minutes_only(stable[rows], canary[rows], -k))
                total += int(run.alarms.sum())
        return total

    if verdicts(cap) <= allowed:
        return cap, verdicts(cap), smallest
    candidates = np.unique(np.concatenate([p[np.isfinite(p) & (p < cap)] for _, _, p in blocks]))
    lo, hi = 0, candidates.size - 1  # verdicts(candidates[hi]) > allowed; alpha = candidates[i] counts p < it
    if verdicts(float(candidates[0])) > allowed:
        return float(candidates[0]), verdicts(float(candidates[0])), smallest
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if verdicts(float(candidates[mid])) <= allowed:
            lo = mid
        else:
            hi = mid
    alpha = float(candidates[lo])
    return alpha, verdicts(alpha), smallest
