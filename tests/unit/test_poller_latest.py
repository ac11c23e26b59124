"""What a watch keeps from one cycle to the next: the gates' budget evidence and the most telling
verdict, not every Detection (kept a cycle long, they were walked by every full collection)."""
from __future__ import annotations

import gc

from core.detection import BudgetEvidence, Detection
from daemon.workers.poller import Latest


def _quiet(score: float, above: float | None) -> Detection:
    budget = BudgetEvidence(above, 40_000.0, 0.0005, 0.001, 0.001) if above is not None else None
    return Detection("tail_excess", False, "quiet", score=score, budget=budget)


def test_latest_keeps_the_budgets_and_the_most_telling_verdict():
    labels = [{"version": "1"}, {"version": "2"}, {"version": "3"}]
    fired = Detection("tail_excess", True, "fired", score=0.5, budget=BudgetEvidence(90.0, 40_000.0, 0.0005, 0.001))
    latest = Latest.of(10.0, 5.0, labels, [_quiet(0.9, 1.0), fired, _quiet(0.1, None)])
    assert latest.series == tuple(labels)
    assert [lab["version"] for lab, _ in latest.budgets] == ["1", "2"]  # v3 has no budget evidence
    assert latest.budgets[1][1].above == 90.0
    assert latest.telling == (labels[1], fired)  # fired before a higher score


def test_latest_of_no_series_has_nothing_to_tell():
    latest = Latest.of(10.0, 5.0, [], [])
    assert latest.telling is None and latest.budgets == [] and latest.series == ()


def test_what_latest_keeps_per_series_leaves_the_cyclic_collector():
    """A full collection walks every tracked object; what a watch keeps per series must not be one
    once the collector has seen it (an exact tuple of numbers)."""
    labels = [{"version": str(i % 2), "instance": f"pod-{i}"} for i in range(100)]
    latest = Latest.of(10.0, 5.0, labels, [_quiet(0.1, 1.0) for _ in labels])
    gc.collect()
    assert len(latest.budget_rows) == 100
    assert not any(gc.is_tracked(row) for row in latest.budget_rows)
    assert [b for _, b in latest.budgets] == [_quiet(0.1, 1.0).budget] * 100  # the gates' view, rebuilt
