"""triton.rollback with requireAttribution acts only on the version that carries the anomaly."""
from __future__ import annotations

import pytest

from core.outcome import Declined
from actions.triton import TritonRollbackParams, plan_rollback
from core.target import Target

TARGET = Target("ranker")
OBSERVED = {"replicas": {"http://t:8000": {
    "index": [{"name": "ranker", "version": "1", "state": "UNAVAILABLE"},
              {"name": "ranker", "version": "2", "state": "READY"}],
    "config": {"name": "ranker", "version_policy": {"latest": {"num_versions": 1}}}}}}
STRICT = TritonRollbackParams.model_validate({"requireAttribution": True})


def test_attributed_to_the_served_version_rolls_back() -> None:
    step = plan_rollback(TARGET, STRICT, OBSERVED, signal_labels={"model": "ranker", "version": "2"})
    assert step.after["version"] == 1


@pytest.mark.parametrize("labels, why", [
    ({"model": "ranker", "version": "1"}, "anomaly is on version 1, not on the newest served version 2"),
    ({"model": "ranker"}, "names no model version"),
])
def test_unattributed_or_old_version_is_refused(labels: dict[str, str], why: str) -> None:
    with pytest.raises(Declined, match=why):
        plan_rollback(TARGET, STRICT, OBSERVED, signal_labels=labels)


def test_alert_signals_are_not_held_to_it() -> None:
    assert plan_rollback(TARGET, STRICT, OBSERVED, signal_labels=None).after["version"] == 1


def test_without_the_requirement_labels_do_not_matter() -> None:
    step = plan_rollback(TARGET, TritonRollbackParams(), OBSERVED, signal_labels={"model": "ranker"})
    assert step.after["version"] == 1
