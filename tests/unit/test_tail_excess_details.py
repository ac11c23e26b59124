"""A tail_excess row's details are read through a view built on first read (the poll cycle's fast
path): it equals, encodes, copies and pickles as the dict its builder gives, every key in order."""
from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest

from core.query import Series
from detectors.sequential.thresholds import STORE
from detectors.tail_excess import TailExcessDetector
from detectors.tail_excess_batch import batch_detections, details_table
from detectors.tail_excess_details import RowDetails, row_details


def batch(evidence: str, rows: int = 24, cols: int = 60) -> tuple[TailExcessDetector, list[Series], list[Series], float]:
    rng = np.random.default_rng(7)
    requests = np.cumsum(rng.poisson(100, (rows, cols)), axis=1).astype(float)
    if evidence == "histogram":
        primary = requests - np.cumsum(rng.binomial(100, 0.02, (rows, cols)), axis=1)
        primary[rows // 2:] = requests[rows // 2:]  # half the rows: nothing above the line
    else:
        primary = np.cumsum(rng.uniform(9e5, 1.1e6, (rows, cols)), axis=1).round()
        primary[: rows // 3, cols // 2:] += np.cumsum(rng.binomial(1, 0.5, (rows // 3, cols - cols // 2)), axis=1) * 2e6
    requests[-1, 5] = np.nan  # a gap
    grid = tuple(1_767_225_600.0 + 5.0 * np.arange(cols))
    labels = [{"pod": str(i), **({"version": str(i % 2)} if i % 3 else {}),
               **({"le": ["500", "700", "x"][i % 3]} if evidence == "histogram" else {})} for i in range(rows)]
    line = 500.0 if evidence == "histogram" else 5e5
    det = TailExcessDetector({"line": line, "lookback_seconds": 600, "evidence": evidence})
    return (det, [Series(lab, grid, tuple(primary[i])) for i, lab in enumerate(labels)],
            [Series(lab, grid, tuple(requests[i])) for i, lab in enumerate(labels)], grid[-1])


@pytest.fixture(autouse=True)
def _derived() -> object:
    """The cells each test's traffic queued are derived before the next (no worker left at exit)."""
    yield None
    assert STORE.wait(600)


@pytest.mark.parametrize("evidence", ["counters", "histogram"])
def test_a_row_view_is_its_dict(evidence: str) -> None:
    det, primary, totals, now = batch(evidence)
    grid, counters = __import__("detectors._grid", fromlist=["align"]).align([*primary, *totals])
    b = det.evaluate(grid, counters[:len(primary)], counters[len(primary):], now)
    labels = [s.labels for s in primary]
    table = details_table(b, labels, "version", tuple(f"{s:g}x" for s in b.test.sizes))
    for row in range(len(primary)):
        want = row_details(table, row)
        view = RowDetails(table, row)
        assert view == want and want == view and dict(view) == want
        assert list(view) == list(want) and len(view) == len(want)
        assert json.dumps(view.get("assumed")) == json.dumps(want["assumed"])
        assert json.dumps(dict(view)) == json.dumps(want) and repr(view) == repr(want)
        assert {**view} == want and "statistic" in view and view.get("nope", 3) == 3
        again = pickle.loads(pickle.dumps(view))
        assert type(again) is dict and again == want and copy.deepcopy(view) == want
        assert view is not want and row_details(table, row) is not want  # a fresh dict per build
    # The detections carry the same details, whichever way each row's are held.
    for d, row in zip(batch_detections(b, det.kind, labels), range(len(primary))):
        expect = row_details(table, row)
        if d.fired or d.reason.startswith("shared slowdown"):  # built at once, and added to
            assert type(d.details) is dict and {k: v for k, v in d.details.items() if k in expect} == expect
        else:
            assert isinstance(d.details, RowDetails) and d.details == expect


def test_a_row_view_is_read_only_and_unhashable() -> None:
    det, primary, totals, now = batch("counters")
    d = det.detect_many(primary, now, totals)[-1]
    with pytest.raises(TypeError):
        d.details["x"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        hash(d.details)
