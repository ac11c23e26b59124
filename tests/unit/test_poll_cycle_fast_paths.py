"""The poll cycle's fast paths give what their straightforward versions give, bit for bit:
counter increments of gap-free rows, episode sums of the rows in an episode, the bulk's pools
taken by width, thresholds looked up once per traffic cell, one batch of
tail_excess Detections, the per-watch memos of label keys and companion pairs, and the detector
gauges observed in one call."""
from __future__ import annotations

import re

import numpy as np
from numpy.typing import NDArray
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from core.detection import Detection
from core.query import Series, series_key
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import RangeResult
from daemon.workers.poller import gauge_series
from daemon.workers.series_pairing import LabelMemo, PairingMemo, pair_companions
from detectors._counter_steps import counter_steps
from detectors.sequential.bank import NONE, run_bank
from detectors.sequential.design import BankDesign
from detectors.sequential.evidence import POOL_REQUESTS, _pooled, _pooled_means
from detectors.sequential.thresholds import NO_CELL, STORE, TRAFFIC_GRID, rounded_traffic, traffic_cells
from detectors.tail_excess import TailExcessDetector
from detectors.tail_excess_batch import row_thresholds, sum_since


# ---- counter increments ---------------------------------------------------------------------

def reference_steps(latency: np.ndarray, requests: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every row by the general rule: each column from the row's previous column with both samples."""
    rows, cols = latency.shape
    valid = np.isfinite(latency) & np.isfinite(requests)
    col_idx = np.broadcast_to(np.arange(cols), (rows, cols))
    last_valid = np.maximum.accumulate(np.where(valid, col_idx, -1), axis=1)
    prev = np.concatenate([np.full((rows, 1), -1), last_valid[:, :-1]], axis=1)
    has_prev = valid & (prev >= 0)
    safe_prev = np.maximum(prev, 0)
    d_lat = latency - np.take_along_axis(latency, safe_prev, axis=1)
    d_req = requests - np.take_along_axis(requests, safe_prev, axis=1)
    resets = has_prev & ((d_lat < 0) | (d_req < 0))
    d_lat = np.where(has_prev, np.where(resets, latency, d_lat), np.nan)
    d_req = np.where(has_prev, np.where(resets, requests, d_req), np.nan)
    first = np.where(valid.any(axis=1), np.argmax(valid, axis=1), -1)
    return d_lat, d_req, resets, first


def counters(rng: np.random.Generator, rows: int, cols: int, gap_share: float) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative counters with restarts; `gap_share` of the rows miss some samples."""
    latency = np.cumsum(rng.uniform(0, 1e4, (rows, cols)), axis=1).round()
    requests = np.cumsum(rng.integers(0, 50, (rows, cols)), axis=1).astype(float)
    for row in range(rows):
        if cols > 2 and rng.random() < 0.2:
            col = int(rng.integers(1, cols))
            latency[row, col:] -= latency[row, col - 1]  # a restart
        if rng.random() < gap_share:
            which = rng.random(cols) < 0.3
            (latency if rng.random() < 0.5 else requests)[row, which] = np.nan
            if rng.random() < 0.3:
                latency[row, rng.random(cols) < 0.2] = np.inf
    return latency, requests


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf, as ever
@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(0, 12), cols=st.integers(0, 9),
       gap_share=st.sampled_from([0.0, 0.1, 0.5, 1.0]))
@pytest.mark.slow
def test_counter_steps_equal_the_general_rule(seed: int, rows: int, cols: int, gap_share: float) -> None:
    latency, requests = counters(np.random.default_rng(seed), rows, cols, gap_share)
    if seed % 5 == 0:  # other dtypes keep the dtypes they always gave
        latency = latency.astype(np.float32)
    try:
        want = reference_steps(latency, requests)
    except (IndexError, ValueError) as exc:  # no column at all: it raises, and so must the fast path
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            counter_steps(latency, requests)
        return
    got = counter_steps(latency, requests)
    for a, b in zip((got.latency, got.requests, got.resets, got.first_valid), want):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)  # NaN == NaN here; bit for bit otherwise


# ---- episode sums ---------------------------------------------------------------------------

def reference_sum_since(x: np.ndarray, start: np.ndarray) -> np.ndarray:
    """0.0, then every column of every row added in column order, 0.0 outside the episode."""
    sums = np.zeros(x.shape[0])
    for col in range(x.shape[1]):
        inside = (col >= start) & (start >= 0)
        sums = sums + np.where(inside, x[:, col], 0.0)
    return sums


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(0, 12), cols=st.integers(0, 9))
def test_sum_since_equals_the_running_sum(seed: int, rows: int, cols: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.choice([0.0, -0.0, 1e-300, 0.1, 3.7, 1e17, -2.5], (rows, cols)) * rng.random((rows, cols))
    start = rng.integers(-1, max(cols, 1), rows)
    got, want = sum_since(x, start), reference_sum_since(x, start)
    assert [v.hex() for v in got.tolist()] == [v.hex() for v in want.tolist()]


# ---- the bulk's pools and the traffic cells --------------------------------------------------

def reference_pooled(cum: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Each element gathered: cum[j + 1] - cum[max(j + 1 - width, 0)]."""
    cols = cum.shape[1] - 1
    start = np.maximum(np.arange(1, cols + 1)[None, :] - width[:, None], 0)
    return cum[:, 1:] - cum[np.arange(cum.shape[0])[:, None], start]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(0, 12), cols=st.integers(1, 30))
def test_pools_by_width_equal_the_gather(seed: int, rows: int, cols: int) -> None:
    rng = np.random.default_rng(seed)
    cum = np.concatenate([np.zeros((rows, 1)), np.cumsum(rng.random((rows, cols)) * 1e5, axis=1)], axis=1)
    width = rng.integers(1, cols + 1, rows)
    if rows and rng.random() < 0.3:
        width[:] = width[0]  # one width for every row: the whole array at once
    got, want = _pooled(cum, width), reference_pooled(cum, width)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()


def reference_pooled_means(latency: np.ndarray, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each step's pool summed element by element over the row's `width` steps ending there, and
    each row's width."""
    rows, cols = latency.shape
    ok = np.isfinite(latency) & np.isfinite(requests) & (requests > 0)
    lat, req = np.where(ok, latency, 0.0), np.where(ok, requests, 0.0)
    width = np.ones(rows, dtype=np.int64)
    out = np.full((rows, cols), np.nan)
    for r in range(rows):
        typical = req[r].sum() / max(int(ok[r].sum()), 1)
        width[r] = min(max(int(np.ceil(POOL_REQUESTS / typical)) if typical > 0 else int(POOL_REQUESTS), 1), cols)
        for j in np.flatnonzero(ok[r]):
            lo = max(0, j + 1 - width[r])
            out[r, j] = lat[r, lo:j + 1].sum() / req[r, lo:j + 1].sum()
    return out, width


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(0, 12), cols=st.integers(1, 30))
def test_pooled_means_read_busy_rows_directly_and_pool_the_rest(seed: int, rows: int, cols: int) -> None:
    rng = np.random.default_rng(seed)
    traffic = rng.choice([0.5, 5.0, 39.0, 40.0, 400.0], rows)[:, None]
    requests = rng.poisson(traffic * np.ones((rows, cols))).astype(float)
    latency = requests * rng.random((rows, cols)) * 300.0
    latency[rng.random((rows, cols)) < 0.1] = np.nan
    got, (want, width) = _pooled_means(latency, requests), reference_pooled_means(latency, requests)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    busy = width == 1
    # A one-step pool is the step's own mean, bit for bit; wider pools agree to rounding.
    assert got[busy].tobytes() == want[busy].tobytes()
    np.testing.assert_allclose(got[~busy], want[~busy], rtol=1e-9)  # running sums round at their own size


def test_traffic_cells_are_the_scalar_rule_also_at_the_edges() -> None:
    rng = np.random.default_rng(3)
    edges = TRAFFIC_GRID ** np.arange(-300, 1200, dtype=float)  # cell tops, where the two logs may part
    values = np.concatenate([rng.random(5000) * 1e4, edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf),
                             [0.0, -1.0, np.nan, np.inf, 1e-300]])
    cells = traffic_cells(values)
    for value, cell in zip(values.tolist(), cells.tolist()):
        top = rounded_traffic(value)
        assert (cell == NO_CELL) if top == 0.0 else (TRAFFIC_GRID ** cell == top), (value, cell, top)


def test_row_thresholds_ask_once_per_cell_and_give_each_row_its_cells() -> None:
    test = TailExcessDetector({"line": 500}).params.test()
    traffic = np.array([10.0, 10.001, 55.5, 0.0, np.nan, 55.4, 1e6])
    asked: list[float] = []

    def lookup(value: float, step: float) -> tuple[tuple[float, ...], bool]:
        asked.append(value)
        top = rounded_traffic(value)
        return tuple(top + k for k in range(len(test.design.ratios))), top > 100

    h, derived = row_thresholds(test, traffic, 1.0, lookup)
    assert len(asked) == len({rounded_traffic(v) for v in traffic.tolist()}) == 4
    for row, value in enumerate(traffic.tolist()):
        want, done = lookup(value, 1.0)
        assert h[:, row].tolist() == list(want) and bool(derived[row]) is done


# ---- tail_excess Detections -----------------------------------------------------------------

@pytest.mark.slow  # each new traffic the examples draw derives its thresholds
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf, as ever
@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 30), cols=st.integers(1, 40),
       line=st.sampled_from([5e3, 5e5]), stale=st.sampled_from([30.0, 2.0]),
       evidence=st.sampled_from(["counters", "histogram"]))
def test_batch_detections_equal_one_row_at_a_time(seed: int, rows: int, cols: int, line: float,
                                                   stale: float, evidence: str) -> None:
    """Every status, fired and quiet rows, tails planted: the batch path decides each row as the
    single-series path does; compared by repr (exact floats, NaN too)."""
    rng = np.random.default_rng(seed)
    latency, requests = counters(rng, rows, cols, 0.3)
    tail = rng.random(rows) < 0.5
    latency[tail, cols // 2:] += np.cumsum(rng.binomial(1, 0.5, (int(tail.sum()), cols - cols // 2)), axis=1) * 1e6
    requests[rng.random(rows) < 0.1] = np.nan  # no request counter
    grid = tuple(1_767_225_600.0 + 5.0 * np.arange(cols))
    now = (grid[-1] if cols else 1_767_225_600.0) + float(rng.choice([0.0, 10.0]))
    det = TailExcessDetector({"line": line, "lookback_seconds": 600, "bulk_window_seconds": 15,
                              "max_staleness_seconds": stale, "evidence": evidence})
    labels = [{"pod": str(i), **({"version": "2"} if i % 2 else {})} for i in range(rows)]
    primary = [Series({"__name__": "a", **lab}, grid, tuple(latency[i])) for i, lab in enumerate(labels)]
    totals = [Series({"__name__": "b", **lab}, grid, tuple(requests[i])) for i, lab in enumerate(labels)]
    det.detect_many(primary, now, totals)
    [det.detect(p, now, t) for p, t in zip(primary, totals)]
    assert STORE.wait()  # the thresholds of every traffic seen derived: both paths read the same ones
    # Each call scores the lookback the call before implied (a single row's traffic implies its own):
    # every single-row call is given the one the batch scored.
    scored = det.lookback_seconds
    got = det.detect_many(primary, now, totals)
    want = []
    for p, t in zip(primary, totals):
        det._lookback = scored
        want.append(det.detect(p, now, t))
    assert [repr(d) for d in got] == [repr(d) for d in want]


# ---- label memos ----------------------------------------------------------------------------

def label_sets(n: int) -> list[dict[str, str]]:
    return [{"__name__": "lat", "pod": f"p{i % 7}", "version": str(i % 3), **({"quantile": "0.9"} if i % 4 else {})}
            for i in range(n)]


@settings(max_examples=100, deadline=None)
@given(cycles=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.floats(0, 1)), min_size=1, max_size=6))
def test_memos_equal_the_functions_through_churn(cycles: list[tuple[int, float]]) -> None:
    """Each cycle keeps some label mappings of the cycle before (the range cache's), replaces
    others with equal or different new ones, and reorders: memoized keys, gauge names and pairs
    are those computed afresh."""
    keys, gauges, pairing = LabelMemo(series_key), LabelMemo(gauge_series), PairingMemo()
    series: list[Series] = []
    companions: list[Series] = []
    for seed, churn in cycles:
        rng = np.random.default_rng(seed)
        pool = label_sets(12)
        series = [s if rng.random() > churn else Series(dict(pool[int(rng.integers(12))]), (), ())
                  for s in series] + [Series(dict(lab), (), ()) for lab in pool[:int(rng.integers(0, 3))]]
        companions = [c if rng.random() > churn else Series({**pool[int(rng.integers(12))], "__name__": "req"}, (), ())
                      for c in companions] + [Series({**lab, "__name__": "req"}, (), ()) for lab in pool[:2]]
        if rng.random() < churn:
            series = [series[i] for i in rng.permutation(len(series))]
        answer = RangeResult("q", companions)
        keys.next_cycle()
        gauges.next_cycle()
        assert list(keys.many(s.labels for s in series)) == [series_key(s.labels) for s in series]
        assert list(gauges.many(s.labels for s in series)) == [gauge_series(s.labels) for s in series]
        got, want = pairing.pair(series, answer), pair_companions(series, answer)
        assert [id(c) for c in got] == [id(c) for c in want]


# ---- detector gauges ------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(cycles=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 2**32 - 1)), min_size=1, max_size=5),
       cap=st.integers(1, 20))
@pytest.mark.slow
def test_observe_many_equals_one_by_one(cycles: list[tuple[int, int]], cap: int) -> None:
    """The same gauges, the same dropped count and the same places, past the cap and through
    evictions of idle series, as one by one and then the series not in the cycle forgotten."""
    one, many = Metrics(), Metrics()
    for m in (one, many):
        m.detector.max_series_per_policy, m.detector.idle_seconds = cap, 20.0
    for k, (n, seed) in enumerate(cycles):
        rng = np.random.default_rng(seed)
        names = [f"pod={int(i)}" for i in rng.integers(0, 60, n)]
        detections = [Detection("tail_excess", bool(rng.random() < 0.1), "r", value=float(rng.random()),
                                baseline=None if rng.random() < 0.3 else 1.0, threshold=13.0) for _ in names]
        now = 10.0 * k
        placed = [one.detector.observe("p", 0, s, d, now) for s, d in zip(names, detections)]
        one.detector.forget("p", 0, keep_at=now)  # what observe_many does after the pairs: series gone go
        assert many.detector.observe_many("p", 0, names, detections, now) == placed.count(False)
    assert exposition(many) == exposition(one)


def exposition(metrics: Metrics) -> list[str]:
    """The registry's samples, without the creation times of its children."""
    return [line for line in generate_latest(metrics.registry).decode().splitlines() if "_created" not in line]


# ---- the bank's floor -------------------------------------------------------------------------

def reference_floor(design: BankDesign, units: NDArray[np.float64], requests: NDArray[np.float64]
                    ) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Each member's final statistic and run start from zero by the rule `_blocks` had: the row's
    minimum, then the last column at or below it."""
    ok = np.isfinite(units) & np.isfinite(requests)
    cu, cn = np.cumsum(np.where(ok, units, 0.0), axis=1), np.cumsum(np.where(ok, requests, 0.0), axis=1)
    rows, cols = units.shape
    final, start = np.empty((len(design.jumps), rows)), np.empty((len(design.jumps), rows), dtype=np.int64)
    for k, (jump, drain) in enumerate(zip(design.jumps, design.drains)):
        x = cu * jump - cn * drain + np.zeros(rows)[:, None]
        low = x.min(axis=1)
        final[k] = x[:, -1] - np.minimum(low, 0.0)
        last = cols - 1 - np.argmax((x <= low[:, None])[:, ::-1], axis=1)
        began = np.where(low <= 0.0, last + 1, 0)
        start[k] = np.where(final[k] > 0.0, began, NONE)
    return final, start


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 40), cols=st.integers(1, 50), ties=st.booleans())
def test_the_banks_floor_in_one_pass_equals_min_then_last_at_it(seed: int, rows: int, cols: int, ties: bool) -> None:
    """`_blocks` reads the floor and its last column with one argmin of the reversed row: the same
    statistic and run start, bit for bit, with ties at the floor and unscored steps."""
    rng = np.random.default_rng(seed)
    units = rng.poisson(0.05, (rows, cols)).astype(float)
    requests = (rng.poisson(40, (rows, cols)) if not ties else np.zeros((rows, cols)) + 0.0).astype(float)
    units[rng.random(units.shape) < 0.1] = np.nan
    design = BankDesign.for_budget(0.001)
    run = run_bank(design, units, requests, np.full(len(design.jumps), 1e9))
    final, start = reference_floor(design, units, requests)
    assert run.state.statistic.tobytes() == final.tobytes()
    assert (run.state.run_start == start).all()
