"""The deciders the operating curve compares, each run over the same simulated steps.

- `Tailguard`: the project's bank (detectors/sequential) with thresholds derived from the stated
  rate at the traffic it has seen over its lookback, on counts (a histogram) or latency mass
  (counters, through the project's mass front end).
- `Limit`: Page's CUSUM with the true pre- and post-change rates, its threshold set for the same
  rate by the same run-length computation (it knows what tailguard has to guess).
- `Naive`: at least N requests above the line in the last 60 s at two consecutive polls 5 s
  apart, counted exactly (the best a PromQL threshold on a 60 s window can do).
- `Alert`: the summary rule users write: P99.9 over its ~60 s window above the line (more than
  0.1% of the window's requests above it), held `for: 30s` at 5 s evaluations, acted on at the
  webhook 5 s later (group_wait); with `gate`, vetoed when the version's evidence over the
  detector's lookback accepts "within budget" (detectors/sequential/acceptance.py).

Each `start(rows)` gives a run fed chunk by chunk (`feed`); an alarm restarts its row, as a
rolled-back version starts a new test. Columns are steps of `step` seconds from the start.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

from detectors.sequential.bank import BankState, count_alarms
from detectors.sequential.design import BankDesign
from detectors.sequential.evidence import mass_evidence
from detectors.sequential.thresholds import STORE, Promise, rounded_traffic, single_threshold
from evaluation.operating_curve.arrivals import Steps

if TYPE_CHECKING:
    from detectors.tail_excess import TailExcessParams

WINDOW_SECONDS = 60.0
POLL_SECONDS = 5.0


class Run(Protocol):
    alarms: NDArray[np.int64]  # per row, so far
    first: NDArray[np.float64]  # per row, seconds from the start to the first alarm (NaN: none)

    def feed(self, steps: Steps) -> None: ...


class Decider(Protocol):
    name: str

    def start(self, rows: int) -> Run: ...


@dataclass
class _Clock:
    """Alarm bookkeeping shared by the runs."""

    rows: int
    step: float
    column: int = 0
    alarms: NDArray[np.int64] = field(init=False)
    first: NDArray[np.float64] = field(init=False)

    def __post_init__(self) -> None:
        self.alarms = np.zeros(self.rows, dtype=np.int64)
        self.first = np.full(self.rows, np.nan)

    def record(self, rows: NDArray[np.int64], columns: NDArray[np.int64]) -> None:
        """Alarms of `rows` on (absolute) `columns`: each known once the column's step is over."""
        np.add.at(self.alarms, rows, 1)
        at = (columns + 1) * self.step
        new = np.isnan(self.first[rows])
        self.first[rows[new]] = at[new]


class Clocked:
    """A run whose alarms and first alarm times are its clock's (every run here keeps one)."""

    clock: _Clock

    @property
    def alarms(self) -> NDArray[np.int64]:
        return self.clock.alarms

    @property
    def first(self) -> NDArray[np.float64]:
        return self.clock.first


# ---- tailguard --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tailguard:
    """The bank, on `evidence` "counts" (a histogram) or "mass" (latency counters)."""

    design: BankDesign
    promise: Promise
    line_ms: float
    evidence: str = "counts"
    lookback_seconds: float = 900.0
    refresh_seconds: float = 300.0  # thresholds follow the observed traffic this often
    bulk_window_seconds: float = 60.0
    bulk_slack: float = 0.25

    @property
    def name(self) -> str:
        return f"tailguard ({'histogram' if self.evidence == 'counts' else 'counters'})"

    def start(self, rows: int) -> "TailguardRun":
        return TailguardRun(self, _Clock(rows, self.promise.step_seconds))

    @classmethod
    def of(cls, params: "TailExcessParams", step_seconds: float, lookback_seconds: float) -> "Tailguard":
        """The decider the live detector with `params` is (its design and promise), in milliseconds."""
        test = params.test()
        return cls(test.design, test.promise(step_seconds), params.line,
                   "counts" if params.evidence == "histogram" else "mass", lookback_seconds,
                   bulk_window_seconds=params.bulk_window_seconds, bulk_slack=params.bulk_slack)


@dataclass
class TailguardRun(Clocked):
    spec: Tailguard
    clock: _Clock
    state: BankState | None = None
    history: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None  # trailing (latency, requests)
    traffic: list[NDArray[np.float64]] = field(default_factory=list)  # per refresh, requests per step

    def feed(self, steps: Steps) -> None:
        units, requests = self._evidence(steps)
        spec, rows = self.spec, units.shape[0]
        step = spec.promise.step_seconds
        every = max(1, int(round(spec.refresh_seconds / step)))
        window = max(1, int(round(spec.lookback_seconds / spec.refresh_seconds)))
        if self.state is None:
            self.state = BankState.empty(len(spec.design.ratios), rows)
        spans: list[tuple[int, int, NDArray[np.float64]]] = []  # (from, to, thresholds) with one h each
        for lo in range(0, units.shape[1], every):
            n = requests[:, lo:lo + every]
            seen = self.traffic[-window:] or [np.nanmean(n, axis=1)]  # the first minute: what it brings
            h = self._thresholds(np.nanmean(np.vstack(seen), axis=0))
            if spans and np.array_equal(spans[-1][2], h):
                spans[-1] = (spans[-1][0], lo + n.shape[1], h)  # same thresholds: one call for both
            else:
                spans.append((lo, lo + n.shape[1], h))
            self.traffic.append(np.nanmean(n, axis=1))
        for lo, hi, h in spans:
            counts, first, self.state = count_alarms(spec.design, units[:, lo:hi], requests[:, lo:hi], h, self.state)
            hit = np.flatnonzero(counts)
            if hit.size:
                self.clock.record(hit, first[hit])
                np.add.at(self.clock.alarms, hit, counts[hit] - 1)
        self.clock.column += units.shape[1]

    def _thresholds(self, traffic: NDArray[np.float64]) -> NDArray[np.float64]:
        rounded = np.array([rounded_traffic(t) for t in traffic])
        table = {t: STORE.derive_now(self.spec.design, self.spec.promise, t) for t in np.unique(rounded)}
        return np.array([table[t] for t in rounded]).T

    def _evidence(self, steps: Steps) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        if self.spec.evidence == "counts":
            return steps.above, steps.requests
        # Latency mass needs its bulk window of earlier steps: carried from the last chunk.
        width = max(1, int(round(self.spec.bulk_window_seconds / self.spec.promise.step_seconds)))
        lat, req = steps.latency_ms, steps.requests
        if self.history is not None:
            lat, req = np.hstack([self.history[0], lat]), np.hstack([self.history[1], req])
        carried = 0 if self.history is None else self.history[0].shape[1]
        ev = mass_evidence(lat, req, self.spec.line_ms, width, self.spec.bulk_slack)
        self.history = (lat[:, -width:], req[:, -width:])
        return ev.units[:, carried:], ev.requests[:, carried:]


# ---- the limit --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """Page's CUSUM of the true null share against the true defect share, on exact counts."""

    null: float
    alternative: float
    promise: Promise
    requests_per_step: float  # the traffic its threshold is set at (the mean of a diurnal trace)

    name: str = "limit"

    @property
    def threshold(self) -> float:
        return single_threshold(self.null, self.alternative, self.promise, self.requests_per_step)

    def start(self, rows: int) -> "LimitRun":
        design = BankDesign(self.null, (self.alternative / self.null,))
        return LimitRun(design, np.array([self.threshold]), _Clock(rows, self.promise.step_seconds))


@dataclass
class LimitRun(Clocked):
    design: BankDesign
    h: NDArray[np.float64]
    clock: _Clock
    state: BankState | None = None

    def feed(self, steps: Steps) -> None:
        counts, first, self.state = count_alarms(self.design, steps.above, steps.requests, self.h, self.state)
        hit = np.flatnonzero(counts)
        if hit.size:
            self.clock.record(hit, first[hit])
            np.add.at(self.clock.alarms, hit, counts[hit] - 1)
        self.clock.column += steps.above.shape[1]


# ---- window rules: the naive poller and the alert -----------------------------------------------


@dataclass
class _Trailing:
    """Per-row running sums over the current chunk and the `keep` columns before it, so that a
    rule can sum any window that ends in the chunk and reaches back at most `keep` columns."""

    keep: int
    tail: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None
    column: int = 0  # absolute column of the chunk's first step
    offset: int = 0  # absolute column of the buffer's first step
    cum: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None

    def extend(self, above: NDArray[np.float64], requests: NDArray[np.float64]) -> None:
        if self.tail is not None:
            above, requests = np.hstack([self.tail[0], above]), np.hstack([self.tail[1], requests])
        rows = above.shape[0]
        self.offset = self.column - (0 if self.tail is None else self.tail[0].shape[1])
        zero = np.zeros((rows, 1))
        self.cum = (np.hstack([zero, np.cumsum(above, axis=1)]), np.hstack([zero, np.cumsum(requests, axis=1)]))
        self.tail = (above[:, -self.keep:], requests[:, -self.keep:])

    def sums(self, rows: NDArray[np.int64], first: NDArray[np.int64], last: int
             ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Sums of `rows` over absolute columns first..last (clipped to what the buffer holds)."""
        assert self.cum is not None
        hi = last - self.offset + 1
        lo = np.clip(first - self.offset, 0, hi)
        return self.cum[0][rows, hi] - self.cum[0][rows, lo], self.cum[1][rows, hi] - self.cum[1][rows, lo]

    def windows(self, polls: NDArray[np.int64], width: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Sums over the `width` columns ending at each poll column, [S x polls] each, all polls at
        once (callers take the few rows that restarted inside a window with `sums`)."""
        assert self.cum is not None
        hi = polls - self.offset + 1
        lo = np.maximum(hi - width, 0)
        return self.cum[0][:, hi] - self.cum[0][:, lo], self.cum[1][:, hi] - self.cum[1][:, lo]

    def finish(self, cols: int) -> None:
        self.column += cols


def _poll_columns(first: int, cols: int, step: float) -> NDArray[np.int64]:
    """The absolute columns of the chunk at whose end a poll happens (every POLL_SECONDS)."""
    every = int(round(POLL_SECONDS / step))
    span = np.arange(first, first + cols)
    return span[(span + 1) % every == 0]


@dataclass(frozen=True)
class Naive:
    n_slow: int
    step: float = 1.0
    polls_needed: int = 2

    @property
    def name(self) -> str:
        return f"naive poller (N={self.n_slow})"

    def start(self, rows: int) -> "NaiveRun":
        width = int(round(WINDOW_SECONDS / self.step))
        return NaiveRun(self, _Clock(rows, self.step), _Trailing(width), np.zeros(rows, dtype=np.int64),
                        np.zeros(rows, dtype=np.int64))


@dataclass
class NaiveRun(Clocked):
    spec: Naive
    clock: _Clock
    trailing: _Trailing
    run: NDArray[np.int64]  # per row, consecutive polls at or over N
    since: NDArray[np.int64]  # per row, the first column the window may count (after an alarm)

    def feed(self, steps: Steps) -> None:
        if steps.slow_done and steps.above.shape[0] == 1:
            self._feed_exact(steps)
            return
        cols = steps.above.shape[1]
        width = self.trailing.keep
        self.trailing.extend(steps.above, steps.requests)
        polls = _poll_columns(self.trailing.column, cols, self.spec.step)
        window, _ = self.trailing.windows(polls, width)
        for k, col in enumerate(polls):
            count = window[:, k]
            recent = np.flatnonzero(self.since > col - width + 1)  # rows that restarted inside the window
            if recent.size:
                count = count.copy()
                count[recent], _ = self.trailing.sums(recent, np.maximum(self.since[recent], col - width + 1),
                                                      int(col))
            self.run = np.where(count >= self.spec.n_slow, self.run + 1, 0)
            hit = np.flatnonzero(self.run >= self.spec.polls_needed)
            if hit.size:
                self.clock.record(hit, np.full(hit.size, col))
                self.run[hit] = 0
                self.since[hit] = col + 1  # a rolled-back version's window starts empty
        self.trailing.finish(cols)

    def _feed_exact(self, steps: Steps) -> None:
        """The replay's model on exact completion times: (p - 60, p] at polls p = 0, 5, 10 ... s."""
        done = steps.slow_done[0]
        run = 0
        for p in np.arange(0.0, steps.above.shape[1] * self.spec.step, POLL_SECONDS):
            k = int(np.searchsorted(done, p, side="right") - np.searchsorted(done, p - WINDOW_SECONDS, side="right"))
            run = run + 1 if k >= self.spec.n_slow else 0
            if run >= self.spec.polls_needed:
                self.clock.alarms[0] += 1
                self.clock.first[0] = p
                return


@dataclass(frozen=True)
class Alert:
    """The summary-quantile alert rule, optionally gated by the version's evidence."""

    quantile: float = 0.999
    for_seconds: float = 30.0
    group_wait_seconds: float = 5.0
    step: float = 1.0
    gate: tuple[float, float, float] | None = None  # (null share, alternative share, error)
    gate_lookback_seconds: float = 900.0

    @property
    def name(self) -> str:
        return "alert rule" + (" + gate" if self.gate else "")

    def start(self, rows: int) -> "AlertRun":
        keep = int(round(max(WINDOW_SECONDS, self.gate_lookback_seconds) / self.step))
        return AlertRun(self, _Clock(rows, self.step), _Trailing(keep), np.zeros(rows, dtype=np.int64),
                        np.zeros(rows, dtype=np.int64))


@dataclass
class AlertRun(Clocked):
    spec: Alert
    clock: _Clock
    trailing: _Trailing
    pending: NDArray[np.int64]  # per row, consecutive true evaluations; -1: firing (wait for false)
    since: NDArray[np.int64]  # per row, the first column of the current version
    vetoed: int = 0

    def feed(self, steps: Steps) -> None:
        spec = self.spec
        cols = steps.above.shape[1]
        width = int(round(WINDOW_SECONDS / spec.step))
        lookback = int(round(spec.gate_lookback_seconds / spec.step))
        need = int(round(spec.for_seconds / POLL_SECONDS)) + 1  # true at t0, t0 + 5, ..., t0 + for
        wait = int(round(spec.group_wait_seconds / spec.step))
        self.trailing.extend(steps.above, steps.requests)
        polls = _poll_columns(self.trailing.column, cols, spec.step)
        slow_w, requests_w = self.trailing.windows(polls, width)
        for k, col in enumerate(polls):
            slow, requests = slow_w[:, k], requests_w[:, k]
            recent = np.flatnonzero(self.since > col - width + 1)  # rows that restarted inside the window
            if recent.size:
                slow, requests = slow.copy(), requests.copy()
                slow[recent], requests[recent] = self.trailing.sums(
                    recent, np.maximum(self.since[recent], col - width + 1), int(col))
            true = slow > (1.0 - spec.quantile) * requests
            self.pending = np.where(true, np.where(self.pending < 0, -1, self.pending + 1), 0)
            fire = np.flatnonzero(self.pending >= need)
            if not fire.size:
                continue
            self.pending[fire] = -1
            if spec.gate is not None:
                null, alternative, error = spec.gate
                units, seen = self.trailing.sums(fire, np.maximum(self.since[fire], col - lookback + 1), int(col))
                # accept_null, vectorized: Lambda = units ln r - requests null (r - 1) <= ln(error).
                ratio = alternative / null
                accepted = units * np.log(ratio) - seen * null * (ratio - 1.0) <= np.log(error)
                self.vetoed += int(accepted.sum())
                fire = fire[~accepted]
            if fire.size:
                self.clock.record(fire, np.full(fire.size, col + wait))
                self.since[fire] = col + 1
        self.trailing.finish(cols)
