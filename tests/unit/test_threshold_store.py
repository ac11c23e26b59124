"""The process's threshold store (detectors/sequential/thresholds.py): closed at exit, it derives no
further cell, waits for the one in hand, and answers Wald's thresholds for cells asked later."""
from __future__ import annotations

from detectors.sequential.design import BankDesign
from detectors.sequential.thresholds import Promise, ThresholdStore, wald_thresholds

DESIGN = BankDesign.for_budget(0.001)
PROMISE = Promise(days=30.0, step_seconds=1.0)


def test_a_closed_store_queues_nothing_and_answers_wald() -> None:
    store = ThresholdStore()
    store.close()
    found, derived = store.get(DESIGN, PROMISE, 40.0)
    assert not derived and found == wald_thresholds(DESIGN, PROMISE)
    assert store._worker is None and store._queue == []  # no thread left to run into the exit


def test_close_waits_for_the_cell_in_hand() -> None:
    """A cell being derived when the process exits is finished before close returns: no daemon
    thread is left deriving while the interpreter finalizes (which broke its last flush of stdout)."""
    store = ThresholdStore()
    store.get(DESIGN, PROMISE, 40.0)
    store.close(timeout=120.0)
    assert store._worker is not None and not store._worker.is_alive()
