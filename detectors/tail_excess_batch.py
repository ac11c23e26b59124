"""One evaluation of `tail_excess` over many series: counters or histogram buckets -> per-step
evidence -> thresholds at each series' traffic -> the bank -> one Detection per series.

Pure given the thresholds (detectors/sequential/thresholds.py derives them from the stated rate)
and vectorized over series; the Detection of each row is built from lists read once per batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from core.detection import BudgetEvidence, Detection
from detectors._counter_steps import counter_steps
from detectors._slow_counts import batch_counting_problem, slow_counts, stated_null, windows
from detectors.base import DetectorStatus
from detectors.sequential.acceptance import accept_null, shown_above
from detectors.sequential.bank import NONE, BankRun, Scored, run_bank, scored_steps
from detectors.sequential.design import BankDesign
from detectors.sequential.evidence import count_evidence, mass_evidence
from detectors.sequential.thresholds import Promise, traffic_cells
from detectors.tail_excess_details import DetailsTable, RowDetails, bucket_bound, row_details

# The statuses a row can have (only OK rows can fire), bound as module names: every row's checks
# read them, and an enum member looked up on its class costs 5x as much.
OK, NO_DATA, STALE, SHORT_HISTORY, NO_COUNTS, INCONSISTENT = (
    DetectorStatus.OK, DetectorStatus.NO_DATA, DetectorStatus.STALE, DetectorStatus.SHORT_HISTORY,
    DetectorStatus.NO_COUNTS, DetectorStatus.INCONSISTENT)

SLOWEST_COUNTED = 0.1
"""Below this many requests per second a series grows no lookback, holds no alarm (an idle version)."""

Thresholds = Callable[[float, float], tuple[tuple[float, ...], bool]]
"""(requests per step, step seconds) -> (each member's threshold, derived: False while Wald's stands in)."""


@dataclass(frozen=True)
class Test:
    """What one trigger's evaluation needs besides the data (built once from its params)."""

    design: BankDesign
    budget: float  # the share of requests the line allows above it (0.001 for P99.9)
    promise_days: float
    line: float
    evidence: str  # counters | histogram
    lookback_seconds: float
    bulk_window_seconds: float
    bulk_slack: float
    max_staleness_seconds: float
    sizes: tuple[float, ...]
    recent_seconds: float = math.inf
    """What a row's budget evidence (the window sums, the alert gate's input) covers: the least
    lookback, however far the scored lookback has grown, so hours of healthy history do not dilute
    a breach that began minutes ago."""
    count_design: BankDesign | None = None
    """Counters: the bank on slow requests counted per step (detectors/_slow_counts.py); None: mass."""
    shared_hold_seconds: float = 0.0
    """How long into a firing version's episode its alarm waits while another serving version's
    evidence is too thin to tell a shared slowdown from this version's defect (0: never)."""
    bank_days: float | None = None
    """The bank's promise when a start test spends part of the rate per deploy (None: promise_days)."""
    start_assumed: tuple[tuple[str, float], ...] = ()
    """What the start test assumes (alpha per deploy, horizon, settle, ...), for every row's details."""

    def promise(self, step_seconds: float) -> Promise:
        return Promise(self.bank_days if self.bank_days is not None else self.promise_days, step_seconds)


@dataclass(frozen=True)
class RowFacts:
    """The per-row numbers of an `ExcessBatch` as Python lists, [S] each: one `.tolist()` per array
    for the whole batch, where reading numpy scalars row by row cost most of one Detection."""

    timestamps: list[float]  # the grid, [P]
    status: list[int]
    fired: list[bool]
    latest: list[int]
    first_seen: list[int]
    score: list[float]
    leader: list[int]
    statistic: list[float]  # [S * K] row-major: row r's members at r * K ... (one list, not S lists)
    thresholds: list[float]  # [S * K]
    derived: list[bool]
    traffic: list[float]  # requests per step over the lookback's scored steps
    window_units: list[float]  # over the recent window (Test.recent_seconds)
    window_requests: list[float]
    episode_start: list[int]
    episode_units: list[float]
    episode_requests: list[float]
    last_allowance: list[float]
    scored_steps: list[int]
    resets: list[int]
    inconsistent: list[int]


@dataclass(frozen=True)
class ExcessBatch:
    """One evaluation of S series on one grid of P timestamps."""

    test: Test
    timestamps: NDArray[np.float64]
    step_seconds: float
    units: NDArray[np.float64]  # [S x P] requests above the line per step (NaN: not scored)
    requests: NDArray[np.float64]
    allowance: NDArray[np.float64] | None  # counters: the per-request latency the bulk explains
    run: BankRun
    thresholds: NDArray[np.float64]  # [K x S]
    derived: NDArray[np.bool_]
    traffic: NDArray[np.float64]
    status: NDArray[np.int8]
    fired: NDArray[np.bool_]
    latest: NDArray[np.int_]
    first_seen: NDArray[np.int_]
    resets: NDArray[np.int_]
    inconsistent: NDArray[np.int_]
    recent_from: int = 0  # the first column of the recent window (0: the whole scored lookback)
    scored: Scored | None = None  # `scored_steps(units, requests)`, when the evaluation made it
    counting: "Counting | None" = None  # counters: how the steps were counted (None: histogram)

    @cached_property
    def facts(self) -> RowFacts:
        """The per-row numbers every Detection reads, computed once for all rows."""
        run, rows = self.run, self.status.shape[0]
        sc = self.scored if self.scored is not None else scored_steps(self.units, self.requests)
        scored = sc.ok
        counted = sc.requests  # the requests of scored steps, read twice
        recent = self.recent_from
        start = run.episode_start - (run.state.column - self.timestamps.size)  # absolute -> this grid
        start = np.where(run.episode_start >= 0, start, -1)
        return RowFacts(
            timestamps=self.timestamps.tolist(), status=self.status.tolist(), fired=self.fired.tolist(),
            latest=self.latest.tolist(), first_seen=self.first_seen.tolist(), score=run.score.tolist(),
            leader=run.leader.tolist(), statistic=run.state.statistic.T.ravel().tolist(),
            thresholds=self.thresholds.T.ravel().tolist(), derived=self.derived.tolist(), traffic=self.traffic.tolist(),
            window_units=sc.units[:, recent:].sum(axis=1).tolist(),
            window_requests=counted[:, recent:].sum(axis=1).tolist(), episode_start=start.tolist(),
            episode_units=sum_since(sc.units, start).tolist(),
            episode_requests=sum_since(counted, start).tolist(),
            last_allowance=(_last_where(self.allowance, scored) if self.allowance is not None
                            else np.full(rows, np.nan)).tolist(),
            scored_steps=run.scored.tolist(), resets=self.resets.tolist(), inconsistent=self.inconsistent.tolist(),
        )


def _last_where(x: NDArray[np.float64], mask: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Per row, `x` at the last column where `mask` holds; NaN where it holds nowhere."""
    rows, cols = x.shape
    if cols == 0:
        return np.full(rows, np.nan)
    last = cols - 1 - np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), x[np.arange(rows), last], np.nan)


def sum_since(x: NDArray[np.float64], start: NDArray[np.int_]) -> NDArray[np.float64]:
    """Per row, the sum of `x` from column `start` to the last (0 where start is -1), added in
    column order: bit for bit the running sum the test used to keep per step. Over the columns of
    a transposed copy, as `page_statistic`: a cumulative sum along rows is several times slower.
    Only the rows in an episode are summed (a few percent of them in a healthy fleet)."""
    rows, cols = x.shape
    sums = np.zeros(rows)
    live = np.flatnonzero(start >= 0)
    if live.size:
        sums[live] = _sum_from(x[live], start[live])
    return sums


def _sum_from(x: NDArray[np.float64], start: NDArray[np.int_]) -> NDArray[np.float64]:
    """Per row, 0.0 plus each of `x` from column `start` (>= 0) on, in column order."""
    inside = np.arange(x.shape[1]) >= start[:, None]
    by_col = np.ascontiguousarray(np.where(inside, x, 0.0).T)
    sums = np.zeros(x.shape[0])
    for column in by_col:
        np.add(sums, column, out=sums)
    return sums


def step_seconds(grid: NDArray[np.float64]) -> float:
    return float(np.median(np.diff(grid))) if grid.size > 1 else 1.0


@dataclass(frozen=True)
class Front:
    """A batch's evidence per row and step, before any test: what every tail test reads."""

    grid: NDArray[np.float64]
    step_seconds: float
    units: NDArray[np.float64]  # [S x P] requests above the line (NaN: not scored)
    requests: NDArray[np.float64]
    allowance: NDArray[np.float64] | None
    traffic: NDArray[np.float64]  # [S] requests per scored step
    status: NDArray[np.int8]  # [S] why a row cannot be decided (OK: it can)
    latest: NDArray[np.int_]
    first_seen: NDArray[np.int_]
    resets: NDArray[np.int_]
    inconsistent: NDArray[np.int_]
    scored: Scored  # units and requests at zero where a step is not scored, and where it is
    design: BankDesign | None = None  # the bank the evidence is for (None: the test's own)
    counting: "Counting | None" = None


@dataclass(frozen=True)
class Counting:
    """How counters were read: slow requests counted per step, or latency mass and why."""

    counted: bool
    why_mass: str = ""  # the reason counting was not used ("" when it was)
    counts_above: NDArray[np.float64] | None = None  # [S] the latency a lone slow request needed at the last step


def front_end(test: Test, grid: NDArray[np.float64], primary: NDArray[np.float64], totals: NDArray[np.float64],
              now: float) -> Front:
    """Per-step evidence of aligned cumulative counters [S x P] on `grid` (ascending, as `align`
    makes it): `primary` is the latency counter (counters) or the bucket at the line (histogram),
    `totals` the request counter or the histogram's count."""
    first_col = int(np.searchsorted(grid, now - test.lookback_seconds, side="left"))
    grid = grid[first_col:]
    primary, totals = primary[:, first_col:], totals[:, first_col:]
    steps = counter_steps(primary, totals)
    step = step_seconds(grid)
    # A counter that went down (a restart, or one pod of a sum restarting) says nothing about its
    # step: the step is left out, never read as the whole count since zero (the increments are
    # this call's own arrays; restarts are a handful of places).
    d_primary, d_total = steps.latency, steps.requests
    if steps.resets.any():
        np.copyto(d_primary, np.nan, where=steps.resets)
        np.copyto(d_total, np.nan, where=steps.resets)
    allowance: NDArray[np.float64] | None = None
    if test.evidence == "histogram":
        ev = count_evidence(d_primary, d_total)
        with np.errstate(invalid="ignore"):
            inconsistent = (np.isfinite(d_primary) & np.isfinite(d_total) & (d_primary > d_total)).sum(axis=1)
    else:
        bulk_cols = max(1, int(round(test.bulk_window_seconds / step)))
        counting, design = _counting(test, d_total, step), test.design
        if counting.counted and test.count_design is not None:
            null = stated_null(test.count_design)
            counts = slow_counts(d_primary, d_total, test.line, null, *windows(step, test.bulk_window_seconds),
                                 test.bulk_slack)
            ev, allowance, design = counts, counts.allowance, test.count_design
            counting = replace(counting, counts_above=_last_where(counts.counts_above, np.isfinite(counts.units)))
        else:
            mass = mass_evidence(d_primary, d_total, test.line, bulk_cols, test.bulk_slack)
            ev, allowance = mass, mass.allowance
        inconsistent = np.zeros(primary.shape[0], dtype=np.int_)
    rows = primary.shape[0]
    # Evidence leaves units and requests NaN at the same steps: scored where the units are finite.
    sc = scored_steps(ev.units, ev.requests)
    scored = sc.ok
    counted = scored.sum(axis=1)
    traffic = np.where(counted > 0, sc.requests.sum(axis=1) / np.maximum(counted, 1), 0.0)
    latest = steps.last_valid  # the last column with a sample of both counters
    status = np.full(rows, OK, dtype=np.int8)
    status[~scored.any(axis=1)] = SHORT_HISTORY
    status[(inconsistent > 0) & ~scored.any(axis=1)] = INCONSISTENT
    status[(latest >= 0) & (grid[np.maximum(latest, 0)] < now - test.max_staleness_seconds)] = STALE
    status[~np.isfinite(totals).any(axis=1)] = NO_COUNTS
    status[latest < 0] = NO_DATA
    return Front(grid, step, ev.units, ev.requests, allowance, traffic, status, latest, steps.first_valid,
                 steps.resets.sum(axis=1), inconsistent, sc, design if test.evidence != "histogram" else None,
                 counting if test.evidence != "histogram" else None)


def _counting(test: Test, requests: NDArray[np.float64], step: float) -> Counting:
    """Whether counters are counted per step (the test asks for it, and the steps are short enough
    at the busiest row's traffic), or read as latency mass, and why."""
    if test.count_design is None:
        return Counting(False, "latency mass (counting per step not asked)")
    problem = batch_counting_problem(requests, test.sizes[0] * test.budget, step)
    return Counting(problem is None, problem or "")


def row_thresholds(test: Test, traffic: NDArray[np.float64], step: float, thresholds: Thresholds
                   ) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Each row's member thresholds [K x S] at its traffic, and whether they are derived yet."""
    # One lookup per traffic cell, not per row: asked with a row of the cell, every row of it gets
    # what the scalar lookup would give it (thresholds.traffic_cells keeps the cells exact).
    cells, first, which = np.unique(traffic_cells(traffic), return_index=True, return_inverse=True)
    table = np.empty((cells.size, len(test.design.ratios)))
    done = np.empty(cells.size, dtype=bool)
    for i, row in enumerate(first.tolist()):
        table[i], done[i] = thresholds(float(traffic[row]), step)
    return np.ascontiguousarray(table[which.reshape(-1)].T), done[which.reshape(-1)]


def evaluate_excess_batch(test: Test, grid: NDArray[np.float64], primary: NDArray[np.float64],
                          totals: NDArray[np.float64], now: float, thresholds: Thresholds,
                          count_thresholds: Thresholds | None = None) -> ExcessBatch:
    """Decide every row of aligned cumulative counters [S x P] (see `front_end`) against the
    null the test's rate is stated at. `count_thresholds`: the thresholds of `test.count_design`,
    used when counters are counted per step (the batch's test then carries that design)."""
    f = front_end(test, grid, primary, totals, now)
    if f.design is not None and f.design is not test.design:
        if count_thresholds is None:
            raise ValueError("counters counted per step need the count design's thresholds")
        test, thresholds = replace(test, design=f.design), count_thresholds
    h, derived = row_thresholds(test, f.traffic, f.step_seconds, thresholds)
    run = run_bank(test.design, f.units, f.requests, h, scored=f.scored)
    fired = (f.status == OK) & run.fired
    # The steps that end after now - recent_seconds: those the least lookback would have scored.
    recent_from = (0 if test.recent_seconds >= test.lookback_seconds
                   else int(np.searchsorted(f.grid, now - test.recent_seconds, side="right")))
    return ExcessBatch(test, f.grid, f.step_seconds, f.units, f.requests, f.allowance, run, h, derived, f.traffic,
                       f.status, fired, f.latest, f.first_seen, f.resets, f.inconsistent, recent_from, f.scored,
                       f.counting)


def _fmt(v: float) -> str:
    return f"{v:.4g}" if math.isfinite(v) else "nan"


def _size(size: float) -> str:
    return f"{size:g}x"


@dataclass(frozen=True)
class _Texts:
    """The parts of the reason lines (and of the budget evidence) that are the same for every row
    of a batch, made once."""

    line: str
    what: str  # what a unit is: "requests" or "requests' worth of latency"
    promise: str
    staleness: str
    sizes: tuple[str, ...]
    window: str  # what the window sums cover: the lookback, or its recent part when they leave steps out
    budget_rates: tuple[float, float, float]  # a row's BudgetEvidence after its counts: null, alternative, allowed

    @classmethod
    def of(cls, test: Test, cut: bool = False, counted: bool = False) -> "_Texts":
        what = ("requests" if test.evidence == "histogram" else "requests (counted per step)" if counted
                else "requests' worth of latency")
        promise = f"one false alarm per {test.promise_days:g} days at {test.design.null:.3%}"
        window = f"the last {test.recent_seconds:g} s" if cut else "the lookback"
        design = test.design
        return cls(_fmt(test.line), what, promise, f"{test.max_staleness_seconds:g}",
                   tuple(_size(s) for s in test.sizes), window,
                   (design.null, design.null * design.ratios[0], test.budget * design.lump))


def batch_detections(b: ExcessBatch, kind: str, labels: Sequence[Mapping[str, str]],
                     version_label: str = "version") -> list[Detection]:
    """The Detection of every row (`labels`: each row's series labels), with a one-line reason
    either way, what the test assumed, and attribution details.

    When a version fires while another version of the answer fires too, or is shown above its
    budget (`judge_others`: a canary and its stable, both serving), the breach is not a version's
    defect but a shared cause (a slow node, a shared dependency): none of them fires, each says so,
    and nothing is rolled back on the detector's word. "Shown above" and not only "fires too": the
    busier version fires first, and the quieter one's evidence that it is just as slow comes before
    its own alarm. Until that evidence can come, the firing is held (`Test.shared_hold_seconds`)."""
    texts = _Texts.of(b.test, b.recent_from > 0,  # the window sums left older scored steps out
                      b.counting is not None and b.counting.counted)
    table = details_table(b, labels, version_label, texts.sizes)
    out = [_row_detection(b, row, kind, row_labels, texts, table) for row, row_labels in enumerate(labels)]
    firing = sorted({lab[version_label] for lab, d in zip(labels, out) if d.fired and version_label in lab})
    if not firing:
        return out
    others = judge_others(b, labels, version_label, firing)
    if len(others.shared) >= 2:
        why = (f"shared slowdown: versions {', '.join(others.shared)} of this model are above budget at once "
               f"(firing: {', '.join(firing)}), so it is not one version's defect")
        extra: dict[str, Any] = {"shared_slowdown": others.shared}
    elif others.undecided and others.age_seconds < b.test.shared_hold_seconds:
        why = (f"held: {'; '.join(others.undecided)}: neither above its budget nor shown below the "
               f"{others.firing_share:.3%} of version {', '.join(firing)}, so a shared slowdown cannot yet be "
               f"told from a defect of this version (held for up to {b.test.shared_hold_seconds:g} s of the "
               f"episode, {others.age_seconds:.0f} s so far)")
        extra = {"shared_hold": {"versions": others.undecided_versions, "age_seconds": others.age_seconds,
                                 "hold_seconds": b.test.shared_hold_seconds}}
    else:
        return out
    return [replace(d, fired=False, reason=f"{why}; {d.reason}", episode_start=None, evidence=(),
                    details={**d.details, **extra})
            if d.fired and lab.get(version_label) in firing else d for lab, d in zip(labels, out)]


HOLD_ERROR = 0.05
"""How sure the evidence must be that another version is less slow than the firing one before
the firing one's alarm stands alone (Wald's acceptance; as `shown_above` is 95% the other way)."""


@dataclass(frozen=True)
class OthersVerdict:
    """What the other serving versions show while some version fires (`judge_others`)."""

    shared: list[str]  # the firing versions and every other shown above its budget, sorted
    undecided: list[str]  # "version v: u above the line in n requests since the episode began (share)"
    undecided_versions: list[str]
    firing_share: float  # the firing versions' share above the line since their episodes began
    age_seconds: float  # how long ago the firing versions' earliest episode began


def judge_others(b: ExcessBatch, labels: Sequence[Mapping[str, str]], version_label: str,
                 firing: Sequence[str]) -> OthersVerdict:
    """Each other version (its rows together) against the firing ones: shown above the budget
    (95% lower bound; acceptance.shown_above) over the recent window or over the firing versions'
    episode from its earliest onset (the time the firing one has been slow, not only its last
    minutes nor hours of its healthy history), and so a shared cause; or shown below the firing
    share over that episode (Wald's acceptance at HOLD_ERROR), and so not slow with it; or neither
    yet (undecided). A version below SLOWEST_COUNTED requests per second over the episode is not
    serving (a drained old version) and holds nothing."""
    f = b.facts
    fire_rows = [row for row, lab in enumerate(labels) if f.fired[row] and lab.get(version_label) in firing]
    since = min(max(f.episode_start[row], 0) for row in fire_rows)
    fire_units = sum(f.episode_units[row] for row in fire_rows)
    fire_requests = sum(f.episode_requests[row] for row in fire_rows)
    firing_share = fire_units / fire_requests if fire_requests > 0 else 0.0
    rows = [row for row, lab in enumerate(labels)
            if lab.get(version_label) is not None and lab.get(version_label) not in firing and f.status[row] == OK]
    versions: dict[str, list[float]] = {}  # recent units, recent requests, episode units, episode requests
    if rows:
        start = np.full(len(rows), since)
        units = sum_since(np.nan_to_num(b.units[rows]), start)
        requests = sum_since(np.where(np.isfinite(b.units[rows]), b.requests[rows], 0.0), start)
        for i, row in enumerate(rows):
            sums = versions.setdefault(labels[row][version_label], [0.0, 0.0, 0.0, 0.0])
            sums[0] += f.window_units[row]
            sums[1] += f.window_requests[row]
            sums[2] += float(units[i])
            sums[3] += float(requests[i])
    allowed = b.test.budget * b.test.design.lump
    null = b.test.design.null
    age = f.timestamps[-1] - f.timestamps[since]
    above: set[str] = set()
    undecided: dict[str, str] = {}
    # Counted steps that cannot say (a heavy bulk: sub-line slow requests in most steps) are no proof of none above.
    above_at = b.counting.counts_above if b.counting is not None and b.counting.counted else None
    blind = {labels[r][version_label] for r in rows if above_at is not None and above_at[r] == math.inf}
    for version, (w_units, w_requests, e_units, e_requests) in versions.items():
        if shown_above(w_units, w_requests, allowed) or shown_above(e_units, e_requests, allowed):
            above.add(version)
        elif e_requests > 0 and e_requests >= SLOWEST_COUNTED * age and firing_share > null and (
                version in blind or not accept_null(e_units, e_requests, null, firing_share, HOLD_ERROR).accepted):
            undecided[version] = (f"version {version}: " + ("its counted steps cannot say (slow requests below the line "
                                  "in most steps)" if version in blind else f"{e_units:.1f} above the line in "
                                  f"{e_requests:.0f} requests since the episode began ({e_units / e_requests:.3%})"))
    return OthersVerdict(sorted({*firing, *above}), [undecided[v] for v in sorted(undecided)], sorted(undecided),
                         firing_share, age)


def details_table(b: ExcessBatch, labels: Sequence[Mapping[str, str]], version_label: str,
                  sizes: tuple[str, ...]) -> DetailsTable:
    """What every row's details are read from, one table per batch (the facts' lists, not copies)."""
    f, test = b.facts, b.test
    return DetailsTable(
        evidence=test.evidence, step_seconds=b.step_seconds, budget=test.budget, null=test.design.null,
        false_alarm_days=test.promise_days, line=test.line, histogram=test.evidence == "histogram", sizes=sizes,
        members=len(test.design.ratios), version_label=version_label, labels=labels, timestamps=f.timestamps,
        traffic=f.traffic, derived=f.derived, thresholds=f.thresholds, statistic=f.statistic, leader=f.leader,
        episode_units=f.episode_units, episode_requests=f.episode_requests, window_units=f.window_units,
        window_requests=f.window_requests, scored_steps=f.scored_steps, resets=f.resets,
        inconsistent=f.inconsistent, first_seen=f.first_seen, lookback_seconds=test.lookback_seconds,
        budget_window_seconds=min(test.recent_seconds, test.lookback_seconds), bank_false_alarm_days=test.bank_days,
        start=test.start_assumed)


def _row_detection(b: ExcessBatch, row: int, kind: str, labels: Mapping[str, str], texts: _Texts,
                   table: DetailsTable) -> Detection:
    f, test = b.facts, b.test
    status, latest = f.status[row], f.latest[row]
    leader, at_row = f.leader[row], row * table.members + f.leader[row]
    stat, h = f.statistic[at_row], f.thresholds[at_row]
    per_second = f.traffic[row] / b.step_seconds
    bulk = f.last_allowance[row] / (1.0 + test.bulk_slack)
    units, reqs = f.episode_units[row], f.episode_requests[row]
    # Only a fired row's details are read every cycle (its signal carries them): built now, as a
    # dict `_fired_evidence` adds to; every other row's are built if and when they are read.
    details: Mapping[str, Any] = RowDetails(table, row)
    fired, onset = False, None
    evidence: tuple[tuple[float, float], ...] = ()
    at = f"{texts.promise}, {per_second:.3g} req/s" + ("" if f.derived[row] else "; Wald bound until derived")
    at += counting_note(b.counting, row, test.line)
    line = texts.line
    bucket = bucket_bound(labels) if table.histogram else test.line
    if bucket is not None and bucket != test.line:
        line = f"{_fmt(bucket)} (the bucket nearest above the line {texts.line})"
    if bucket is None:
        reason = (f"no bucket bound: the series has no numeric `le` label; evidence: histogram needs the "
                  f"bucket at the line ({texts.line}) or the nearest above")
    elif bucket < test.line:
        reason = (f"the bucket le={_fmt(bucket)} is below the line {texts.line}: it counts requests faster than the "
                  "line, never the ones above it; nothing decided")
    elif status == NO_DATA:
        reason = "no data: no samples of both series in the lookback window"
    elif status == NO_COUNTS:
        reason = ("no request count: tail_excess needs companionQuery (the request counter, or the "
                  "histogram's _count) with the same labels")
    elif status == STALE:
        reason = f"stale: newest sample at {f.timestamps[latest]:.0f} is older than {texts.staleness} s"
    elif status == INCONSISTENT:
        reason = (f"inconsistent histogram: the bucket at the line counts more than the total in "
                  f"{f.inconsistent[row]} step(s) (buckets that decrease, or bucket and count from different "
                  "series); nothing decided")
    elif status == SHORT_HISTORY:
        reason = "too little history: no step to compare against yet"
    else:
        share = f.window_units[row] / f.window_requests[row] if f.window_requests[row] > 0 else 0.0
        if f.episode_start[row] < 0 and not f.fired[row]:
            reason = (f"no excess: {share:.3%} of requests above {line} over {texts.window} "
                      f"({f.window_units[row]:.1f} {texts.what} in {f.window_requests[row]:.0f}); no member "
                      f"above zero ({at})")
        else:
            ep_share = units / reqs if reqs > 0 else 0.0
            what = (f"~{units:.1f} {texts.what} above {line} in {reqs:.0f} requests since the episode "
                    f"began ({ep_share:.2%}); the {texts.sizes[leader]}-budget member at {stat:.2f}")
            if not f.fired[row]:
                reason = f"{what} < {h:.2f} ({at})"
            else:
                fired, reason = True, f"{what} >= {h:.2f} ({at})"
                details = row_details(table, row)
                onset, evidence = _fired_evidence(b, row, details)
    budget = None
    if status == OK and bucket is not None and bucket >= test.line:
        budget = BudgetEvidence(f.window_units[row], f.window_requests[row], *texts.budget_rates)
    return Detection(detector=kind, fired=fired, reason=reason, value=stat,
                     baseline=bulk if math.isfinite(bulk) else None, threshold=h, score=f.score[row],
                     episode_start=onset, evidence=evidence, details=details, budget=budget)


def counting_note(counting: Counting | None, row: int, line: float) -> str:
    """What the reason adds about how counters were read: why as mass, or a count that could not
    see requests just above the line (sub-line slow requests share steps); nothing otherwise."""
    if counting is None:
        return ""
    if not counting.counted:
        return f"; {counting.why_mass}" if counting.why_mass else ""
    above = float(counting.counts_above[row]) if counting.counts_above is not None else math.nan
    if above == math.inf:
        return ("; no step counts: slow requests below the line in most steps (a heavy bulk) hide whether one "
                "is above it")
    if math.isfinite(above) and above > 1.01 * line:
        return (f"; a lone slow request counts only above {_fmt(above)}: slow requests below the line share "
                "steps often enough to pass for one above it")
    return ""


def _fired_evidence(b: ExcessBatch, row: int, details: dict[str, Any]) -> tuple[float, tuple[tuple[float, float], ...]]:
    """A fired row's onset and evidence (its last 20 steps with units above zero)."""
    f = b.facts
    start, first = f.episode_start[row], f.first_seen[row]
    start = max(start, 0)
    onset = f.timestamps[start]
    if first >= 0:
        details["onset_after_first_sample_s"] = onset - f.timestamps[first]
    cols = np.flatnonzero(np.nan_to_num(b.units[row]) > 0)
    cols = cols[cols >= start][-20:]
    return onset, tuple((float(b.timestamps[i]), float(b.units[row, i])) for i in cols)


__all__ = ["NONE", "ExcessBatch", "Test", "batch_detections", "evaluate_excess_batch", "sum_since"]
