"""The live canary judge (detectors/canary.py `judge`) replayed over simulated pairs, every step.

At every step, over its lookback, the stable's share above the line over the steps the canary
served in (`stable_reference`), floored at half budget and placed on the 10% grid, becomes the
canary's null (`canary_design`); the canary's bank is run from zero over the same lookback with
thresholds from the stated rate at the canary's traffic per scored step, and a firing is confirmed
over the canary's episode (`episode_fired`); while the canary's whole life is in the lookback, the
start test (detectors/canary_start.py) judges its life, computed for every column at once
(`JudgeRun._start_verdicts`). The live detector recomputes this each cycle
(`interval: 1s`); the replay calls the live functions for each of those steps. The lookback is the
live detector's (`canary_lookback` at the canary's requests per scored step, read from the first
chunk: it grows for a slow canary), and the start test's bound holds over its steps.

Running the bank over every lookback of a day is too slow, so a bound goes first (a canary judged
at a higher null has smaller jumps and the same drains: its statistic is at most the one at the
row's lowest null, a sliding-window CUSUM in closed form); the exact check runs only where the
bound reaches a threshold. A verdict restarts its row: a canary shifted away and deployed again
starts a new test, its earlier evidence gone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from detectors.canary import canary_design, canary_lookback, episode_fired, reference_step, stable_reference
from detectors.canary_start import SERVED_CHANCE, bank_days, start_alpha, start_thresholds
from detectors.sequential.bank import run_bank
from detectors.sequential.design import BankDesign
from detectors.sequential.thresholds import STORE, TRAFFIC_GRID, Promise, rounded_traffic
from detectors.tail_excess import TailExcessParams
from evaluation.operating_curve.deciders import Clocked, _Clock
from evaluation.operating_curve.pairs import PairSteps

def sliding_min(x: NDArray[np.float64], width: int) -> NDArray[np.float64]:
    """[R x (n - width + 1)]: the min of x[:, a : a + width] for each a (van Herk / Gil-Werman: a
    running minimum forward and one backward within blocks of `width`, three passes)."""
    rows, n = x.shape
    blocks = -(-n // width)
    padded = np.full((rows, blocks * width), np.inf)
    padded[:, :n] = x
    shaped = padded.reshape(rows, blocks, width)
    forward = np.minimum.accumulate(shaped, axis=2).reshape(rows, -1)
    backward = np.minimum.accumulate(shaped[:, :, ::-1], axis=2)[:, :, ::-1].reshape(rows, -1)
    return np.minimum(backward[:, :n - width + 1], forward[:, width - 1:n])


def _grid_steps(values: NDArray[np.float64], base: float, grid: float, exact: Callable[[float], int]
                ) -> NDArray[np.int64]:
    """ceil(log(values / base) / log(grid) - 1e-9), vectorized, with the values within 1e-6 of a
    grid point recomputed by the live code's own function (`exact`): the same step as it finds."""
    x = np.log(values / base) / math.log(grid) - 1e-9
    steps = np.ceil(x)
    near = np.abs(x - np.rint(x)) < 1e-6
    for index in zip(*np.nonzero(near)):
        steps[index] = exact(float(values[index]))
    return steps.astype(np.int64)


def _traffic_step(t: float) -> int:
    return int(round(math.log(rounded_traffic(t)) / math.log(TRAFFIC_GRID)))


@dataclass(frozen=True)
class Judge:
    """The live judge, recomputed over its lookback at every step (histogram evidence)."""

    params: TailExcessParams
    step: float = 1.0
    lookback_seconds: float | None = None  # None: the live detector's rule (`lookback_for`)
    versus_stable: bool = True  # False: the null is never raised (tail_excess on the canary alone)
    label: str = ""
    weight: float = 0.0  # the canary's share of the route (the start test's rule); 0: no start test
    canary_traffic: float | None = None  # the canary's requests per scored step; None: read from the data

    @property
    def name(self) -> str:
        return self.label or ("judge" if self.versus_stable else "single-version (live window)")

    def promise(self) -> Promise:
        """The running bank's promise: what the start test leaves of the stated rate (the stated
        rate itself without a start test)."""
        test = self.params.test()
        alpha = start_alpha(test.promise_days) if self.versus_stable and self.weight > 0 else 0.0
        return Promise(bank_days(test.promise_days, alpha), self.step) if self.versus_stable else test.promise(self.step)

    def lookback_for(self, canary_traffic: float) -> float:
        """The lookback at a canary of `canary_traffic` requests per scored step: `lookback_seconds`
        when set; else the live detector's (detectors/canary.py `canary_lookback`, at the running
        bank's derived thresholds; tail_excess on the canary alone, `versus_stable` False, grows its
        window by the same rule at its own thresholds)."""
        if self.lookback_seconds is not None:
            return self.lookback_seconds
        p = self.params
        if not canary_traffic > 0:
            return p.lookback_seconds_
        h = STORE.derive_now(p.test().design, self.promise(), canary_traffic)[0]
        return canary_lookback(p, canary_traffic, self.step, h)

    def width_for(self, canary_traffic: float) -> int:
        return int(round(self.lookback_for(canary_traffic) / self.step))

    def start(self, rows: int) -> "JudgeRun":
        return JudgeRun(self, _Clock(rows, self.step), [], np.full(rows, np.iinfo(np.int64).min))


@dataclass
class JudgeRun(Clocked):
    spec: Judge
    clock: _Clock
    tails: list[NDArray[np.float64]]  # the last `width` steps: stable units, requests, canary units, requests
    since: NDArray[np.int64]  # per row, the first column of the current canary (after a verdict)
    candidates: int = 0  # windows the exact check ran on (the bound let them through)
    width: int = 0  # the lookback in steps, set at the first chunk (from the canary's traffic in it)

    def _begin(self, pair: PairSteps) -> None:
        """The lookback, from the canary's requests per scored step in the first chunk (as the live
        detector reads its traffic; `canary_traffic` when given), and empty tails of that width."""
        traffic = self.spec.canary_traffic
        if traffic is None:
            n = pair.canary.requests
            traffic = float(np.nanmean(n)) if np.isfinite(n).any() else 0.0
        self.width = self.spec.width_for(traffic)
        rows = self.since.size
        self.tails = [np.full((rows, self.width), np.nan) for _ in range(4)]

    def feed(self, pair: PairSteps) -> None:
        if not self.tails:
            self._begin(pair)
        w, cols = self.width, pair.cols
        arrays = [np.hstack([tail, new]) for tail, new in zip(self.tails, (
            pair.stable.above, pair.stable.requests, pair.canary.above, pair.canary.requests))]
        columns = pair.column - w + np.arange(w + cols)  # absolute column of each array column
        pending = np.arange(arrays[0].shape[0])
        after = np.full(pending.size, np.iinfo(np.int64).min)
        while pending.size:
            for i in (2, 3):  # a canary shifted away: its evidence before the verdict is gone
                arrays[i][pending] = np.where(columns[None, :] >= self.since[pending, None], arrays[i][pending], np.nan)
            fired = self._first_verdicts([a[pending] for a in arrays], columns, after)
            hit = fired >= 0
            rows = pending[hit]
            if rows.size:
                self.clock.record(rows, columns[fired[hit]])
                self.since[rows] = columns[fired[hit]] + 1
            pending, after = rows, columns[fired[hit]]
        self.tails = [a[:, -w:].copy() for a in arrays]

    def _first_verdicts(self, arrays: list[NDArray[np.float64]], columns: NDArray[np.int64],
                        after: NDArray[np.int64]) -> NDArray[np.int64]:
        """Per row, the index of the first evaluated column (after `after`) where the judge fires
        (-1: none)."""
        spec = self.spec
        w = self.width
        test = spec.params.test()
        alpha = start_alpha(test.promise_days) if spec.versus_stable and spec.weight > 0 else 0.0
        promise = spec.promise()
        su, sn, cu, cn = arrays
        rows, total = su.shape

        def window(x: NDArray[np.float64]) -> NDArray[np.float64]:  # sums over each column's lookback
            c = np.concatenate([np.zeros((rows, 1)), np.cumsum(np.nan_to_num(x), axis=1)], axis=1)
            return c[:, w + 1:] - c[:, 1:total - w + 1]

        s_ok, c_ok = np.isfinite(su), np.isfinite(cu)
        beside = s_ok & c_ok  # the stable over the steps the canary served in, as the live judge reads it
        s_units, s_requests = window(np.where(beside, su, np.nan)), window(np.where(beside, sn, np.nan))
        c_count, c_requests = window(c_ok.astype(np.float64)), window(np.where(c_ok, cn, np.nan))
        evaluated = (window(s_ok.astype(np.float64)) > 0) & (c_count > 0) & (columns[None, w:] > after[:, None])
        if not evaluated.any():
            return np.full(rows, -1)
        null = test.design.null
        if spec.versus_stable:
            with np.errstate(divide="ignore", invalid="ignore"):
                reference = stable_reference(np.where(evaluated, s_units, 0.0), s_requests, null)
            steps = np.where(evaluated, _grid_steps(np.where(evaluated, reference, null), null, 1.1,
                                                    lambda r: reference_step(r, null)), 0)
        else:
            steps = np.zeros((rows, total - w), dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            traffic = np.where(evaluated, c_requests / c_count, 1.0)
        cells = _grid_steps(traffic, 1.0, TRAFFIC_GRID, _traffic_step)
        keys = np.where(evaluated, steps * 100_000 + cells, -1)
        table: dict[int, tuple[BankDesign, NDArray[np.float64]]] = {}
        for key in np.unique(keys[evaluated]).tolist():
            r, c = np.argwhere(keys == key)[0]
            design = canary_design(test.design, key // 100_000)
            table[key] = design, np.array(STORE.derive_now(design, promise, float(traffic[r, c])))
        # A bound first: a canary judged at a higher null has smaller jumps and the same drains, so
        # its statistic is at most that of the row's lowest null; only where the bound reaches a
        # threshold does the exact check (the live core, run_bank over the lookback) run.
        lowest = np.where(evaluated, steps, np.iinfo(np.int64).max).min(axis=1)
        lowest = np.where(lowest == np.iinfo(np.int64).max, 0, lowest)
        uu = np.concatenate([np.zeros((rows, 1)), np.cumsum(np.nan_to_num(cu), axis=1)], axis=1)
        nn = np.concatenate([np.zeros((rows, 1)), np.cumsum(np.where(c_ok, cn, 0.0), axis=1)], axis=1)
        members = len(test.design.ratios)
        jumps = np.array([canary_design(test.design, int(s)).jumps for s in np.unique(lowest)])
        jump_of = jumps[np.searchsorted(np.unique(lowest), lowest)]  # [rows x K]
        ordered = sorted(table)
        h_of = np.vstack([*(table[key][1] for key in ordered), np.full(members, np.inf)])  # [keys + 1 x K]
        index = np.where(evaluated, np.searchsorted(np.array(ordered), keys), len(ordered))
        maybe = np.zeros((rows, total - w), dtype=bool)
        for j, drain in enumerate(test.design.drains):
            d = uu * jump_of[:, j:j + 1] - nn * drain
            stat = d[:, w + 1:] - sliding_min(d, w + 1)[:, 1:]
            maybe |= stat >= h_of[index, j] - 1e-6
        maybe &= evaluated
        never = np.iinfo(np.int64).max
        found = np.full(rows, never)
        if alpha > 0:
            found = self._start_verdicts(alpha, [su, sn, cu, cn], keys, table, evaluated, traffic)
        fired = np.where(found < never, found, -1)
        if not maybe.any():
            return fired
        r, c = np.nonzero(maybe)
        order = np.lexsort((r, c))  # by column: a row's later candidates wait until its earlier ones missed
        r, c = r[order], c[order]
        units_view, requests_view = sliding_window_view(cu, w, axis=1), sliding_window_view(cn, w, axis=1)
        s_units_view = sliding_window_view(np.where(beside, su, np.nan), w, axis=1)
        s_requests_view = sliding_window_view(np.where(beside, sn, np.nan), w, axis=1)
        lo, batch = 0, 64
        while lo < r.size:
            rb, cb = r[lo:lo + batch], c[lo:lo + batch]
            lo += rb.size
            batch = min(4096, 2 * batch)
            open_ = cb + w < found[rb]
            rb, cb = rb[open_], cb[open_]
            kb = keys[rb, cb]
            for key in np.unique(kb).tolist():
                at = kb == key
                design, h = table[key]
                ra, ca = rb[at], cb[at] + 1
                run = run_bank(design, units_view[ra, ca], requests_view[ra, ca], h)
                self.candidates += int(at.sum())
                step = key // 100_000
                fired = np.array([bool(run.fired[i]) and (not spec.versus_stable or episode_fired(
                    test.design, step, run, i, units_view[ra[i], ca[i]], requests_view[ra[i], ca[i]],
                    s_units_view[ra[i], ca[i]], s_requests_view[ra[i], ca[i]],
                    lambda d: STORE.derive_now(d, promise, float(traffic[ra[i], ca[i] - 1]))))
                    for i in range(ra.size)], dtype=bool)
                np.minimum.at(found, ra[fired], cb[at][fired] + w)
        return np.where(found < never, found, -1)

    def _start_verdicts(self, alpha: float, arrays: list[NDArray[np.float64]],
                        keys: NDArray[np.int64], table: dict[int, tuple[BankDesign, NDArray[np.float64]]],
                        evaluated: NDArray[np.bool_], traffic: NDArray[np.float64]) -> NDArray[np.int64]:
        """Per row, the array index of the first evaluated column where the live judge's start test
        fires (`life_start` over that column's lookback, then `start_statistic` against
        `start_thresholds`); int64 max where it does not."""
        w = self.width
        su, sn, cu, cn = arrays
        rows, total = cu.shape
        never = np.iinfo(np.int64).max
        has = np.nan_to_num(cn) > 0
        # The next canary request at or after each index (total: none), by a backward running min.
        at = np.where(has, np.arange(total)[None, :], total)
        next_request = np.minimum.accumulate(at[:, ::-1], axis=1)[:, ::-1]
        ends = np.arange(w, total)  # each evaluated column's last array index
        first = next_request[:, ends - w + 1]  # the canary's first request in that lookback
        inside = first <= ends[None, :]
        zero = np.zeros((rows, 1))
        s_cum = np.concatenate([zero, np.cumsum(np.nan_to_num(sn), axis=1)], axis=1)
        u_cum = np.concatenate([zero, np.cumsum(np.nan_to_num(cu), axis=1)], axis=1)
        n_cum = np.concatenate([zero, np.cumsum(np.nan_to_num(cn), axis=1)], axis=1)
        f = np.minimum(first, total - 1)
        r = np.arange(rows)[:, None]
        before = s_cum[r, f] - s_cum[:, ends - w + 1]
        began = inside & evaluated & (before >= math.log(SERVED_CHANCE) / math.log1p(-self.spec.weight))
        if not began.any():
            return np.full(rows, never)
        units = u_cum[:, ends + 1] - u_cum[r, f]
        requests = n_cum[:, ends + 1] - n_cum[r, f]
        hit = np.zeros_like(began)
        for key in np.unique(keys[began]).tolist():
            design = table[key][0]
            cell = began & (keys == key)
            r0, c0 = np.argwhere(cell)[0]
            bound = start_thresholds(design, alpha, rounded_traffic(float(traffic[r0, c0])), w)
            for jump, drain, h in zip(design.jumps, design.drains, bound):
                hit |= cell & (units * jump - requests * drain >= h)
        return np.where(hit.any(axis=1), np.argmax(hit, axis=1) + w, never)
