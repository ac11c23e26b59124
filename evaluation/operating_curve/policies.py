"""The policy benchmark's runs: simulated deploys of a version through an example policy as written,
every decision made by the live code (evaluation/operating_curve/policy_live.py).

A deploy is a row: v1 serves `PRE` seconds, then v2 takes all traffic (its first request at 0).
Per second: the model's requests (the traffic's rate), those above the line (Poisson at the fault's
share) and, for latency counters, their summed latency (each request's own 2-4 ms, as
`arrivals.poisson_chunk`, plus the slow path's).

Calling `detect_many` every second of 20,000 version-days is out of reach, so the bank is screened:
Page's statistic of each member from the deploy on (the live `page` on the live front end's
evidence, the live design's increments) is never below the statistic a cycle recomputes over its
lookback, which starts later from zero. Only where it reaches `SCREEN` of the member's lowest
derived threshold at the traffic seen is the live detector polled, at every poll interval, in time
order; on counters, under both readings the live detector may use (latency mass, and slow requests
counted per step with the count design), since a screen on mass alone misses where counts cross
(0.2% at 600 ms weighs little as mass). The start test fires on the first crossing of the version's life and says when in every
later cycle of its horizon: it is read from the live detector once, at the horizon's end. Alert
webhooks (policy_alerts.py) are ruled in time order with the bank's candidate polls; the first
rollback ends the version.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from detectors._slow_counts import slow_counts, stated_null, windows
from detectors.sequential.bank import member_increments, page
from detectors.sequential.design import BankDesign
from detectors.sequential.evidence import mass_evidence
from detectors.sequential.thresholds import STORE, rounded_traffic
from evaluation.operating_curve.arrivals import BULK_MS, Fault
from evaluation.operating_curve.policy_alerts import AlertModel, notifications
from evaluation.operating_curve.policy_live import LiveRow, Row, alert_acts, start_fire
from evaluation.operating_curve.policy_models import PolicyModel
from evaluation.operating_curve.traffic import DAY, Traffic

PRE = 300  # v1 serves this long before the deploy (the alert's window and the detector's first cycles)
SCREEN = 0.9  # the screen polls the live detector where Page's statistic reaches this share of h
MAX_POLLS = 400  # live polls per row at most for the bank's candidates (a defect fires long before)


@dataclass(frozen=True)
class Setup:
    """What one cell runs: a policy, its traffic, the alert model and how the alert is ruled."""

    model: PolicyModel
    traffic: Traffic
    alert: AlertModel | None
    ruling: str  # gate | governed | live


@dataclass
class Outcome:
    """Per row: when the version was rolled back (inf: not within the run) and by what."""

    at: NDArray[np.float64]
    by: list[str]
    live_calls: int = 0
    capped: int = 0  # rows whose bank candidates were cut at MAX_POLLS
    notes: list[str] = field(default_factory=list)


def simulate(traffic: Traffic, fault: Fault, rows: int, seconds: int, rng: np.random.Generator,
             counters: bool, onset: float = 0.0, before: Fault | None = None, pre: int = PRE) -> list[Row]:
    """`rows` deploys of `seconds` after the deploy: `before` (default: `fault`) until `onset`
    seconds after it, `fault` from then (v1 serves at `before` too)."""
    before = fault if before is None else before
    n = pre + seconds
    t = np.arange(n) - pre + 0.5
    phases = rng.uniform(0, DAY, rows) if traffic.swing else np.zeros(rows)
    req = traffic.rate(t[None, :], phases[:, None]) * np.ones((rows, 1))
    share = np.where(t >= onset, fault.share, before.share)
    ms = np.where(t >= onset, fault.latency_ms, before.latency_ms)
    slow = rng.poisson(req * share[None, :]).astype(np.float64)
    lat = None
    if counters:
        mean_ms = 0.5 * (BULK_MS[0] + BULK_MS[1])
        sd_ms = (BULK_MS[1] - BULK_MS[0]) / np.sqrt(12.0)
        lat = (req * mean_ms + np.sqrt(req) * sd_ms * rng.standard_normal(req.shape) + slow * ms[None, :]) * 1000.0
    return [Row(pre, req[r], slow[r], None if lat is None else lat[r]) for r in range(rows)]


@dataclass(frozen=True)
class Screen:
    """Each member's screen level, per design the live detector may read with: the test's own
    (counts on a histogram, latency mass on counters) and, on counters, the count design's (slow
    requests counted per step, what the live detector reads where steps are short enough)."""

    levels: NDArray[np.float64]
    count_levels: NDArray[np.float64] | None = None


def screen_levels(model: PolicyModel, traffic: Traffic) -> Screen:
    """Each member's lowest derived threshold over the traffic cells the trace can show (derived now,
    so the live detector finds them derived too, as a daemon does after its first minute)."""
    test = model.params.test()
    promise = test.promise(model.interval)
    low = traffic.mean * (1.0 - traffic.swing) * model.interval
    high = traffic.mean * (1.0 + traffic.swing) * model.interval
    cells = {rounded_traffic(low), rounded_traffic(high)}
    x = low
    while x < high:
        cells.add(rounded_traffic(x))
        x *= 1.05

    def lowest(design: BankDesign) -> NDArray[np.float64]:
        table = np.array([STORE.derive_now(design, promise, c) for c in sorted(cells) if c > 0])
        return np.asarray(table.min(axis=0) * SCREEN)

    counted = model.params.count_design()
    return Screen(lowest(test.design), None if counted is None else lowest(counted))


def candidates(model: PolicyModel, row: Row, screen: Screen, begin: float) -> NDArray[np.float64]:
    """The poll times (s from the deploy, from `begin` on) where some member's statistic since
    `begin` reaches its screen level. On counters, under either reading the live detector may use
    (latency mass, or slow requests counted per step): a poll wherever one of them could cross."""
    step = model.interval
    first = math.ceil(max(begin, 0.0) / step) * step
    grid = np.arange(first, row.requests.size - row.pre - 1 + 1e-9, step)
    if grid.size < 2:
        return np.empty(0)
    idx = np.rint(grid).astype(np.int64) + row.pre
    req_c, slow_c, lat_c = row.cumulative()
    d_req = np.diff(req_c[idx])[None, :]
    test = model.params.test()
    readings: list[tuple[BankDesign, NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]] = []
    if lat_c is None:
        readings.append((test.design, screen.levels, np.diff(slow_c[idx])[None, :], d_req))
    else:
        d_lat = np.diff(lat_c[idx])[None, :]
        window = max(1, int(round(test.bulk_window_seconds / step)))
        ev = mass_evidence(d_lat, d_req, test.line, window, test.bulk_slack)
        readings.append((test.design, screen.levels, np.nan_to_num(ev.units), np.nan_to_num(ev.requests)))
        counted = model.params.count_design()
        if counted is not None and screen.count_levels is not None:
            c = slow_counts(d_lat, d_req, test.line, stated_null(counted),
                            *windows(step, test.bulk_window_seconds), test.bulk_slack)
            readings.append((counted, screen.count_levels, np.nan_to_num(c.units), np.nan_to_num(c.requests)))
    over = np.zeros(grid.size - 1, dtype=bool)
    for design, levels, units, requests in readings:
        for k in range(len(design.ratios)):
            s, _ = page(member_increments(design, k, units, requests))
            over |= s[0] >= levels[k]
    found: NDArray[np.float64] = grid[1:][over]
    return found


def run_row(setup: Setup, row: Row, levels: Screen, outcome: Outcome, index: int,
            restart_at: float | None = None) -> None:
    """One deploy through the policy: the first rollback's time and cause into `outcome`."""
    model, step = setup.model, setup.model.interval
    end = float(row.requests.size - row.pre - 1)
    if restart_at is None:
        fire, starts = start_fire(model, row)
        history_from, started_at = -math.inf, -1e9
        first_cycle = -float(row.pre)
        begin = 0.0
    else:  # the daemon (re)starts: its history of a `triton` source is gone; the journal's start is restored
        fire, starts = math.inf, ({"2": 1700000000.0 + step} if model.start_alpha > 0 else {})
        history_from = restart_at if model.source == "triton" else -math.inf
        started_at, first_cycle = restart_at, math.ceil((restart_at + 1e-9) / step) * step
        begin = max(0.0, history_from)
    best, cause = fire, "start test"
    live = LiveRow(model, row, history_from)
    if starts and hasattr(live.detector, "restore_starts"):  # the journal's starts, as the poller hands them
        live.detector.restore_starts(starts)
    events: list[tuple[float, int, str]] = []
    polls = candidates(model, row, levels, begin)
    polls = polls[polls >= first_cycle]
    if polls.size > MAX_POLLS:
        outcome.capped += 1
        polls = polls[:MAX_POLLS]
    events += [(float(t), 0, "") for t in polls]
    if setup.alert is not None:
        for index_alert in model.alerts:
            for t in notify_times(setup, row, restart_at):
                events.append((float(t), 1, str(index_alert)))
    warmed = False
    for t, kind, what in sorted(events):
        if t >= best or t > end:
            break
        if kind == 0:
            if not warmed:  # the live poller's lookback follows the traffic it saw last cycle
                live.poll(t)
                warmed = True
            if live.fired(t):
                best, cause = t, "detector"
        else:
            acts, _ = alert_acts(setup.ruling, model, int(what), live, t, started_at, first_cycle)
            if acts:
                best, cause = t, "alert"
    outcome.at[index] = best
    outcome.by[index] = cause if math.isfinite(best) else ""
    outcome.live_calls += live.calls + (3 if restart_at is None and starts else 0)


def notify_times(setup: Setup, row: Row, restart_at: float | None) -> NDArray[np.float64]:
    """The alert's webhooks for this row (the model's requests of both versions), from the deploy,
    or from the restart."""
    assert setup.alert is not None
    times = notifications(setup.alert, row.slow[None, :], row.requests[None, :], -float(row.pre))[0]
    return times[times >= (0.0 if restart_at is None else restart_at)]


def run_rows(setup: Setup, rows: list[Row], restarts: NDArray[np.float64] | None = None) -> Outcome:
    out = Outcome(np.full(len(rows), math.inf), [""] * len(rows))
    levels = screen_levels(setup.model, setup.traffic)
    for i, row in enumerate(rows):
        run_row(setup, row, levels, out, i, None if restarts is None else float(restarts[i]))
    return out
