"""tail_excess's start test: which versions started where this process could see it, and the test
of each version's life since its first request (detectors/sequential/start_test.py) beside the
running bank, with a clear reason for every input it cannot read.

A start is a version's first request. It counts only when the version's request counter at its
first sample is below `start_below_requests`, or other versions served at least that many
requests before its first sample (a version already serving would have had samples there). A
version serving when this detector first evaluates (a daemon start, a failover, a changed
trigger) gets no start test unless its start was handed in (`restore_starts`, from the journal):
a restart never starts a second test, and never one from a guessed start. Each version has at
most one start test for as long as the detector lives, so the per-deploy probability holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from core.detection import Detection
from detectors.sequential.acceptance import accept_null, shown_above
from detectors.sequential.start_test import first_crossing, life_statistic, start_bounds
from detectors.tail_excess_batch import HOLD_ERROR, OK, SLOWEST_COUNTED, ExcessBatch, Test
from detectors.tail_excess_settle import settle_end
from detectors.tail_excess_start_evidence import StartEvidence, neighbour_evidence, start_evidence

START_GRID = 1.25
"""The start bound is computed at the top of the version's traffic on a grid of this ratio (its
bound covers TRAFFIC_MARGIN x that traffic's requests, start_test.py): few cells, each once."""


@runtime_checkable
class RemembersStarts(Protocol):
    """A detector that keeps versions' start times: the poller hands it the journaled ones before
    its first cycle and journals the ones it finds (a restart then resumes, never restarts, a test)."""

    def restore_starts(self, starts: Mapping[str, float]) -> None:
        """Start times (unix seconds) of versions, as journaled."""

    def take_new_starts(self) -> list[tuple[str, float]]:
        """The starts found since the last call (version, unix seconds), to journal."""


@dataclass(frozen=True)
class StartRule:
    """What the start test assumes (TailExcessParams' `start_*`)."""

    alpha: float
    horizon_seconds: float
    settle_seconds: float
    below_requests: float

    def describe(self) -> dict[str, float]:
        return {"alpha_per_deploy": self.alpha, "horizon_seconds": self.horizon_seconds,
                "settle_seconds": self.settle_seconds, "start_below_requests": self.below_requests}

    def span_seconds(self, step: float) -> float:
        """How much history a live start test needs: its settle and horizon and two steps."""
        return self.settle_seconds + self.horizon_seconds + 2.0 * step


@dataclass(frozen=True)
class VersionRows:
    """One version's rows of an answer: which, whether any served a request in the range, and
    (built when first read: most cycles read none) their summed request counter [P]."""

    rows: list[int]
    serving: bool
    totals: NDArray[np.float64] = field(repr=False)  # the answer's request counters [S x P]

    @cached_property
    def total(self) -> NDArray[np.float64]:
        """Summed cumulative requests per column (NaN: no row has a sample)."""
        block = self.totals[self.rows]
        seen = np.isfinite(block).any(axis=0)
        return np.where(seen, np.nansum(block, axis=0), np.nan)


@dataclass(frozen=True)
class StartVerdict:
    """A version's start test this cycle."""

    version: str
    status: str  # running | fired | ended | stopped | unserved | none
    reason: str
    details: dict[str, Any]
    fired: bool = False
    started_at: float | None = None


@dataclass
class StartBook:
    """The start times this detector knows and what it decided about each version. The only state
    the start test keeps; every verdict is recomputed from the queried range."""

    rule: StartRule
    first_cycle_done: bool = False
    served: set[str] = field(default_factory=set)  # versions seen serving (no start unless known)
    starts: dict[str, float] = field(default_factory=dict)  # version -> start (unix seconds)
    notes: dict[str, list[str]] = field(default_factory=dict)  # version -> bad input seen
    stopped: dict[str, str] = field(default_factory=dict)  # version -> why its test stopped
    new: list[tuple[str, float]] = field(default_factory=list)

    def restore(self, starts: Mapping[str, float]) -> None:
        """Known starts (the journal's). A second, different time for a known version (a deploy seen
        twice) keeps the earliest and says so; a start that is not a finite time is ignored, said."""
        for version, at in starts.items():
            if not isinstance(at, (int, float)) or not math.isfinite(at):
                self._note(str(version), f"journaled start {at!r} is not a time; ignored")
                continue
            have = self.starts.get(version)
            if have is not None and abs(have - at) > 1e-6:
                self._note(version, f"a second start at {at:.0f} handed in for a version that started at "
                                    f"{min(have, at):.0f}: one start test per version, the earliest kept")
                at = min(have, at)
            self.starts[version] = float(at)

    def take_new(self) -> list[tuple[str, float]]:
        out, self.new = self.new, []
        return out

    def _note(self, version: str, text: str) -> None:
        notes = self.notes.setdefault(version, [])
        if text not in notes:
            notes.append(text)
            del notes[:-4]  # the last few, not a growing list


def version_rows(labels: Sequence[Mapping[str, str]], version_label: str, totals: NDArray[np.float64]
                 ) -> tuple[dict[str, VersionRows], list[int]]:
    """Each version's rows and summed request counter; the rows without the version label."""
    groups: dict[str, list[int]] = {}
    unlabeled = []
    for row, lab in enumerate(labels):
        version = lab.get(version_label)
        if version is None or version == "":
            unlabeled.append(row)
        else:
            groups.setdefault(version, []).append(row)
    # A row served in the range when its counter moved (fmax/fmin skip NaN; an all-NaN row compares False).
    moved = (np.fmax.reduce(totals, axis=1) > np.fmin.reduce(totals, axis=1)) if totals.shape[1] else (
        np.zeros(totals.shape[0], dtype=bool))
    out = {version: VersionRows(rows, bool(moved[rows].any()), totals) for version, rows in groups.items()}
    return out, unlabeled


def find_starts(book: StartBook, grid: NDArray[np.float64], versions: Mapping[str, VersionRows]) -> None:
    """Decide which versions started in this range and record them in `book` (pure but for the
    book). Versions serving at the detector's first evaluation are marked served, with no start."""
    serving = {v for v, vr in versions.items() if vr.serving}
    if not book.first_cycle_done:
        book.first_cycle_done = True
        book.served |= serving - set(book.starts)
        return
    for version in sorted(serving - book.served - set(book.starts)):
        vr = versions[version]
        book.served.add(version)
        at = start_of(grid, vr.total, versions, version, book.rule.below_requests)
        if at is None:
            first = int(np.flatnonzero(np.isfinite(vr.total))[0])
            book._note(version, f"first seen with {vr.total[first]:.0f} requests served and no other version "
                                f"serving {book.rule.below_requests:g} requests alone before it: it served before "
                                "the range, not a start")
            continue
        book.starts[version] = at
        book.new.append((version, at))


def start_of(grid: NDArray[np.float64], total: NDArray[np.float64], versions: Mapping[str, VersionRows],
             version: str, below: float) -> float | None:
    """When the version's first request was seen: the first sample whose counter is above zero when
    its first sample is below `below` requests, or its first sample when the other versions served
    `below` requests before it; None when neither (it served before the range)."""
    have = np.flatnonzero(np.isfinite(total))
    if not have.size:
        return None
    first = int(have[0])
    if total[first] < below:
        up = np.flatnonzero(np.isfinite(total) & (total > 0))
        return float(grid[int(up[0])]) if up.size else None
    if first == 0:
        return None
    before = sum(_requests_in(vr.total[:first + 1]) for v, vr in versions.items() if v != version)
    return float(grid[first]) if before >= below else None


def _requests_in(total: NDArray[np.float64]) -> float:
    """Requests a cumulative counter counted between its samples (resets left out)."""
    x = total[np.isfinite(total)]
    if x.size < 2:
        return 0.0
    d = np.diff(x)
    return float(d[d > 0].sum())


def test_version(book: StartBook, version: str, grid: NDArray[np.float64], units: NDArray[np.float64],
                 requests: NDArray[np.float64], resets: int, now: float, design: Any,
                 others: Others, hold_seconds: float = 0.0, settled: float | None = None) -> StartVerdict:
    """The start test of one version with a known start, over its summed evidence per step [P] on
    `grid` (NaN: not scored). `resets`: counter resets in its rows over the range; `others`: what
    the other versions show (above budget: a shared cause, no fire; undecided: a crossing waits up
    to `hold_seconds` for them, as the bank's alarm does); `settled`: when its settle ended (at the
    longest settle when not given). The test ends `settle_seconds + horizon` after the start
    whenever its settle ended: a few steps more than the horizon, inside the bound's margin."""
    rule, at = book.rule, book.starts[version]
    end = at + rule.settle_seconds + rule.horizon_seconds
    since = at + rule.settle_seconds if settled is None else settled
    base: dict[str, Any] = {"started_at": at, **rule.describe(), "ends_at": end, "settled_at": since}
    notes = book.notes.get(version)
    if notes:
        base["notes"] = list(notes)
    if version in book.stopped:
        return StartVerdict(version, "stopped", book.stopped[version], {**base, "status": "stopped"}, started_at=at)
    if grid.size < 2 or grid[0] > at:
        status = "ended" if now >= end else "unseen"
        why = ("its horizon is over" if status == "ended" else
               "its start is older than the queried range: not recomputable, nothing decided")
        return StartVerdict(version, status, f"start test of version {version} (started {at:.0f}): {why}",
                            {**base, "status": status}, started_at=at)
    if resets:
        book.stopped[version] = (f"start test of version {version} stopped: its counters reset during the test "
                                 "(a restart of its server); the running bank goes on")
        return StartVerdict(version, "stopped", book.stopped[version], {**base, "status": "stopped"}, started_at=at)
    step = float(np.median(np.diff(grid)))
    begins = np.concatenate([[grid[0] - step], grid[:-1]])
    inside = (begins >= since - 1e-9) & (grid <= end)
    u = np.where(inside, units, np.nan)
    n = np.where(inside, requests, np.nan)
    scored = np.isfinite(u) & np.isfinite(n)
    if not scored.any():
        status = "ended" if now >= end else "running"
        return StartVerdict(version, status, f"start test of version {version}: no scored step since its settle "
                                             f"({since - at:.3g} s after {at:.0f}) yet",
                            {**base, "status": status, "scored_steps": 0}, started_at=at)
    stat = life_statistic(design, u, n)
    traffic = float(n[scored].mean())
    cell = START_GRID ** math.ceil(math.log(traffic) / math.log(START_GRID)) if traffic > 0 else 0.0
    bounds = start_bounds(design, rule.alpha, cell, max(1, int(math.ceil(rule.horizon_seconds / step))))
    cross = first_crossing(stat, bounds)
    last = int(np.flatnonzero(scored)[-1])
    k = int(np.argmax(stat[:, last] / np.asarray(bounds)))
    units_sum, requests_sum = float(np.nansum(u)), float(np.nansum(n))
    details = {**base, "scored_steps": int(scored.sum()), "requests": requests_sum, "above_line": units_sum,
               "requests_per_second": traffic / step, "bound": bounds[0],
               "statistic": float(stat[k, last]), "leader": k}
    what = (f"{units_sum:.1f} above the line in {requests_sum:.0f} requests since version {version} started at "
            f"{at:.0f} (settle {since - at:.3g} s, horizon {rule.horizon_seconds:g} s, one false alarm in "
            f"{1 / rule.alpha:.0f} deploys)")
    if cross >= 0:
        fired_at = float(grid[cross])
        details.update(status="fired", fired_at=fired_at)
        if others.above:
            details.update(status="shared", shared_slowdown=list(others.above))
            return StartVerdict(version, "shared", f"start test: {what} reached its bound at {fired_at:.0f}, but "
                                f"version(s) {', '.join(others.above)} are above budget too: a shared cause, no fire",
                                details, started_at=at)
        if others.undecided and now - fired_at < hold_seconds:
            details.update(status="held", shared_hold=list(others.undecided))
            return StartVerdict(version, "held", f"start test held: {what} reached its bound at {fired_at:.0f}; "
                                f"version(s) {', '.join(others.undecided)} cannot yet be told slow too or not (held "
                                f"up to {hold_seconds:g} s, {now - fired_at:.0f} s so far)", details, started_at=at)
        return StartVerdict(version, "fired", f"start test: {what}; member {k} reached {bounds[0]:.2f} at "
                                              f"{fired_at:.0f}", details, fired=True, started_at=at)
    status = "ended" if now >= end else "running"
    details["status"] = status
    return StartVerdict(version, status, f"start test ({status}): {what}; leading member at "
                                         f"{stat[k, last]:.2f} < {bounds[0]:.2f}", details, started_at=at)


def apply_verdicts(out: list[Detection], decided: Sequence[bool], version_label: str, rule: StartRule,
                   verdicts: Mapping[str, StartVerdict], by_version: Mapping[str, VersionRows],
                   unlabeled: Sequence[int], unserved: Mapping[str, float],
                   first_seen: Mapping[int, float] | None = None) -> list[Detection]:
    """Each Detection with its version's start test: in `details["start_test"]` and what it assumed
    in `details["assumed"]["start_test"]`; a fired start test fires the version's first decided row
    (its episode starts at the version's start, the dedup key). Rows without the version label, and
    starts of versions no longer served, are said, never fired."""
    result = list(out)
    for version, v in verdicts.items():
        rows = by_version[version].rows
        lead = next((r for r in rows if decided[r]), None)  # a row with fresh data carries the verdict
        for row in rows:
            d = out[row]
            details = dict(d.details)
            details["start_test"] = v.details
            seen = (first_seen or {}).get(row)
            if seen is not None and "series_first_seen" in details:
                details["series_first_seen"] = seen  # the bank's series begin at the settle's end
            assumed = details.get("assumed")
            if isinstance(assumed, Mapping):
                details["assumed"] = {**assumed, "start_test": {**rule.describe(), "started_at": v.started_at}}
            if v.fired and row == lead and not d.fired:
                if seen is not None and v.started_at is not None:
                    details["onset_after_first_sample_s"] = v.started_at - seen
                result[row] = replace(d, fired=True, reason=f"{v.reason}; {d.reason}", episode_start=v.started_at,
                                      details=details)
            else:
                result[row] = replace(d, details=details, reason=d.reason if row != lead else f"{d.reason}; {v.reason}")
    for row in unlabeled:
        result[row] = without_label(out[row], version_label)
    if unserved and result:
        gone = "; ".join(f"version {v} (started {at:.0f}) is no longer served: its start test decides nothing"
                         for v, at in sorted(unserved.items()))
        d = result[0]
        result[0] = replace(d, reason=f"{d.reason}; {gone}", details={**dict(d.details), "unserved_starts": dict(unserved)})
    return result


def without_label(d: Detection, version_label: str) -> Detection:
    """A row whose series has no version label: no start test, said (the batch and the one-series
    path alike)."""
    why = f"no start test: the series has no {version_label!r} label"
    return replace(d, reason=f"{d.reason}; {why}", details={**dict(d.details), "start_test": {
        "status": "no_version_label", "reason": why}})


@dataclass(frozen=True)
class Others:
    """What the other versions of the answer show beside a version's start test."""

    above: list[str]  # shown above their budget: a shared cause
    undecided: list[str]  # serving, neither above budget nor shown below the version's share yet


def judge_others(batch: ExcessBatch, versions: Mapping[str, VersionRows], version: str,
                 spans: Mapping[str, tuple[float, float]], allowed: float, null: float, age: float) -> Others:
    """The bank's shared-slowdown rule (tail_excess_batch.judge_others) over the start test's span:
    each other version shown above its budget over the bank's recent window or over the span (a
    shared cause), or, serving, not yet shown below this version's share over the span by Wald's
    acceptance (HOLD_ERROR): undecided, and a crossing waits for it as the bank's alarm does.

    `spans`: per version, (units above the line, requests) since the start test's settle ended: the
    version's own as its start test reads it, the others' as `neighbour_evidence` does (latency
    mass on counters: a version whose counted steps say nothing, a heavy bulk hiding whether a step
    holds a request above the line, is not read as none above it). `allowed` and `null` are in the
    others' units."""
    f = batch.facts
    mine_u, mine_n = spans.get(version, (0.0, 0.0))
    share = mine_u / mine_n if mine_n > 0 else 0.0
    above, undecided = [], []
    for other, vr in sorted(versions.items()):
        if other == version:
            continue
        w_u = sum(f.window_units[r] for r in vr.rows)
        w_n = sum(f.window_requests[r] for r in vr.rows)
        e_u, e_n = spans.get(other, (0.0, 0.0))
        if shown_above(w_u, w_n, batch.test.budget * batch.test.design.lump) or shown_above(e_u, e_n, allowed):
            above.append(other)
        elif (e_n > 0 and e_n >= SLOWEST_COUNTED * age and share > null
              and not accept_null(e_u, e_n, null, share, HOLD_ERROR).accepted):
            undecided.append(other)
    return Others(above, undecided)


@dataclass(frozen=True)
class StartFrame:
    """One answer's versions, as the start tests read them."""

    by_version: dict[str, VersionRows]
    unlabeled: list[int]
    first_seen: dict[int, float] = field(default_factory=dict)  # started versions' rows: their first sample
    settled: dict[str, float] = field(default_factory=dict)  # started versions: when their settle ended (`settle`)


def frame_starts(book: StartBook, grid: NDArray[np.float64], totals: NDArray[np.float64],
                 labels: Sequence[Mapping[str, str]], version_label: str) -> StartFrame:
    """Group the answer by version and record in `book` the starts it shows (the whole fetched
    grid: a start test may reach further back than the bank's window)."""
    by_version, unlabeled = version_rows(labels, version_label, totals)
    find_starts(book, grid, by_version)
    # Before the settle takes their first samples out: what `series_first_seen` says of these rows.
    first_seen = {}
    for version in book.starts:
        vr = by_version.get(version)
        for row in vr.rows if vr is not None else ():
            have = np.flatnonzero(np.isfinite(totals[row]))
            if have.size:
                first_seen[row] = float(grid[int(have[0])])
    return StartFrame(by_version, unlabeled, first_seen)


def settle(book: StartBook, frame: StartFrame, grid: NDArray[np.float64], counters: NDArray[np.float64],
           rows: int, evidence: str, line: float) -> NDArray[np.float64]:
    """`counters` [2S x P] (the primary rows, then their companions) with every sample of a started
    version taken before its settle ended left out: its series begin at the settle's end, so no
    test, the bank included, reads the requests the deploy's own model load held as evidence
    (detectors/tail_excess_settle.py; each end is put in `frame.settled`). The input itself when
    nothing is left out."""
    out = counters
    for version, at in book.starts.items():
        vr = frame.by_version.get(version)
        if vr is None:
            continue
        primary = _sum_finite(counters[vr.rows])
        ends = settle_end(grid, at, book.rule.settle_seconds, primary, vr.total, evidence, line)
        frame.settled[version] = ends
        cut = int(np.searchsorted(grid, ends, side="left"))
        if cut <= 0:
            continue
        if out is counters:
            out = counters.copy()
        idx = np.asarray(vr.rows + [r + rows for r in vr.rows])
        out[idx, :cut] = np.nan
    return out


def run_start_tests(book: StartBook, frame: StartFrame, test: Test, grid: NDArray[np.float64],
                    primary: NDArray[np.float64], totals: NDArray[np.float64], version_label: str,
                    now: float, batch: ExcessBatch, out: list[Detection]) -> list[Detection]:
    """The start tests of one evaluation: each version with a known start, tested over the aligned
    range, its verdict put on `out` (the bank's Detections, one per row). `test`: the detector's own
    (its front end decides the evidence for the version's rows alone)."""
    by_version, unlabeled = frame.by_version, frame.unlabeled
    rule = book.rule
    step = float(np.median(np.diff(grid))) if grid.size > 1 else 1.0
    f = batch.facts
    verdicts: dict[str, StartVerdict] = {}
    unserved: dict[str, float] = {}
    for version, at in list(book.starts.items()):
        end = at + rule.settle_seconds + rule.horizon_seconds
        vr = by_version.get(version)
        if vr is None:
            if now < end:
                unserved[version] = at
            elif now > end + rule.horizon_seconds:
                del book.starts[version]  # long over and gone: it stays `served`, never started again
            continue
        if now > end + rule.horizon_seconds:
            continue  # over for a horizon: the verdict is no longer news
        first_col = int(np.searchsorted(grid, at - 2.0 * step, side="left"))
        cols = slice(first_col, None)
        ev = _evidence(test, grid, primary, totals, vr.rows, first_col, now)
        if ev.why_not:
            verdicts[version] = StartVerdict(version, "none", ev.why_not, {"status": "none", "reason": ev.why_not},
                                             started_at=at)
            continue
        units = _sum_finite(ev.units)
        requests = _sum_finite(np.where(np.isfinite(ev.units), ev.requests, np.nan))
        gaps = _gaps(vr.total[cols], ev.grid, at)
        if gaps:
            book._note(version, f"missing from the answer for {gaps} step(s) since its start (it disappeared and "
                                "returned): those steps are not scored")
        since = frame.settled.get(version, at + rule.settle_seconds)
        spans = {v: neighbour_evidence(test, grid[first_col:], primary[other.rows, first_col:],
                                       totals[other.rows, first_col:], now).span(since)
                 for v, other in by_version.items() if v != version}
        spans[version] = ev.span(since)
        others = judge_others(batch, by_version, version, spans, test.budget * test.design.lump, test.design.null,
                              max(now - since, 0.0))
        verdicts[version] = test_version(book, version, ev.grid, units, requests, ev.resets, now, ev.design, others,
                                         test.shared_hold_seconds, since)
    decided = [s == OK for s in f.status]
    return apply_verdicts(out, decided, version_label, rule, verdicts, by_version, unlabeled, unserved,
                          frame.first_seen)


def _evidence(test: Test, grid: NDArray[np.float64], primary: NDArray[np.float64], totals: NDArray[np.float64],
              rows: list[int], first_col: int, now: float) -> StartEvidence:
    """The evidence of `rows` from `first_col` as a start test reads it (tail_excess_start_evidence.py)."""
    return start_evidence(test, grid[first_col:], primary[rows, first_col:], totals[rows, first_col:], now)


def _sum_finite(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per column, the sum over rows of the finite values (NaN where none is)."""
    return np.where(np.isfinite(x).any(axis=0), np.nansum(x, axis=0), np.nan)


def _gaps(total: NDArray[np.float64], grid: NDArray[np.float64], at: float) -> int:
    """Columns after the version's start and before its last sample where it has none."""
    have = np.flatnonzero(np.isfinite(total) & (grid >= at))
    if have.size < 2:
        return 0
    return int(have[-1] - have[0] + 1 - have.size)


__all__ = ["RemembersStarts", "StartBook", "StartRule", "StartVerdict", "apply_verdicts", "find_starts",
           "StartFrame", "frame_starts", "Others", "judge_others", "run_start_tests", "settle", "start_of", "without_label", "test_version", "version_rows"]
