"""What the daemon reads of a detector is typed (detectors/base.py): every detector's parameters
declare `version_label` and `max_staleness_seconds`, every Detection carries its status (here
through a poll cycle), and a detector's details never overwrite the poller's own keys of a signal."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.detection import Detection, DetectorStatus
from core.query import Series
from core.signal import Signal
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import RangeResult
from daemon.storage.journal import Journal
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.poller import Poller, Watch, detection_signal, staleness_horizon
from detectors import base
from detectors.tail_excess import TailExcessDetector
from detectors.threshold import ThresholdDetector
from detectors.value_cusum import ValueCusumDetector
from policies.loader import load_policies_text

POLICY = """
name: p999
target: {model: ranker}
triggers:
  - detector:
      type: value_cusum
      query: 'p999{model="$model"}'
      interval: 5s
actions:
  - type: notify
    url: http://127.0.0.1:9/hook
guards: {cooldown: 0s}
verify: {query: 'vector(0)', below: 1, onNotRecovered: none}
"""

# What each detector says (its own default) or leaves to the base: the poller's horizon follows.
OWN_STALENESS = {"threshold": 60.0, "tail_anomaly": 60.0, "value_cusum": 60.0, "tail_excess": 30.0,
                 "tail_canary": 30.0, "forecast_breach": None}


def test_every_detectors_params_declare_what_the_daemon_reads() -> None:
    registry = detector_registry()
    assert set(registry) == set(OWN_STALENESS)
    for kind, detector in registry.items():
        fields = detector.Params.model_fields
        assert fields["version_label"].default == "version", kind
        assert fields["max_staleness_seconds"].default == OWN_STALENESS[kind], kind
    # The base's defaults hold for a detector that has none of its own; strict as ever otherwise.
    assert base.DetectorParams.model_fields["max_staleness_seconds"].default is None
    with pytest.raises(ValueError, match="max_staleness_seconds"):
        ThresholdDetector.Params.model_validate({"threshold": 1.0, "max_staleness_seconds": 0})
    with pytest.raises(ValueError, match="no_such_key"):
        ThresholdDetector.Params.model_validate({"threshold": 1.0, "no_such_key": 1})


def test_detector_status_is_the_core_enum_and_defaults_to_ok() -> None:
    assert base.DetectorStatus is DetectorStatus
    assert Detection("x", True, "fired").status is DetectorStatus.OK


class _Prometheus:
    def __init__(self, series: list[Series]) -> None:
        self.series = series

    async def query_range(self, query: str, start: float, end: float, step: float) -> RangeResult:
        return RangeResult(query, [s for s in self.series if s.timestamps and s.timestamps[0] <= end])


def _poller(journal: Journal, series: list[Series], policy: str = POLICY) -> Poller:
    async def emit(signal: Signal) -> None:
        raise AssertionError("nothing fires here")

    async def offload(*args: Any) -> Any:
        raise AssertionError("nothing to offload")

    poller = Poller(_Prometheus(series), journal, Metrics(), detector_registry(), emit, offload,  # type: ignore[arg-type]
                    incremental_range_queries=False)
    poller.sync(load_policies_text(policy, "test", action_registry(), detector_registry()))
    return poller


def _watch(poller: Poller) -> Watch:
    return next(w for g in poller.groups.values() for w in g.watches)


@pytest.fixture
def journal(tmp_path: Path):  # type: ignore[no-untyped-def]
    j = Journal(tmp_path / "journal.db")
    yield j
    j.close()


async def test_a_too_little_history_verdict_carries_its_status_through_a_poll_cycle(journal: Journal) -> None:
    """A new model with six points: value_cusum cannot compare yet, and the verdict the poller keeps
    says so as a status, not only in words."""
    now = 1000.0
    series = Series({"model": "ranker", "version": "1"}, tuple(now - 5.0 * i for i in range(5, -1, -1)),
                    (0.2, 0.21, 0.19, 0.2, 0.2, 0.21))
    poller = _poller(journal, [series])
    for group in list(poller.groups.values()):
        await poller.poll_group(group, now)
    latest = _watch(poller).latest
    assert latest is not None and latest.telling is not None
    _, verdict = latest.telling
    assert not verdict.fired and verdict.reason.startswith("too little history")
    assert verdict.status is DetectorStatus.SHORT_HISTORY
    # The poller reads the horizon from the typed parameter: value_cusum's own minute.
    assert staleness_horizon(_watch(poller)) == 60.0


def test_the_horizon_is_three_intervals_when_the_params_say_none(journal: Journal) -> None:
    forecast = POLICY.replace("type: value_cusum", "type: forecast_breach").replace(
        "interval: 5s", "interval: 30s\n      params: {threshold: 1.0}")
    watch = _watch(_poller(journal, [], forecast))
    assert watch.bound.params.max_staleness_seconds is None
    assert staleness_horizon(watch) == 90.0


def test_a_detail_named_like_the_pollers_keys_does_not_overwrite_them(journal: Journal) -> None:
    watch = _watch(_poller(journal, []))
    d = Detection("value_cusum", True, "fired", score=2.0, episode_start=990.0, evidence=((990.0, 0.9),),
                  details={"query": "up{job=\"elsewhere\"}", "shadow": True, "scale": 0.01})
    signal = detection_signal(watch, Series({"version": "1"}, (), ()), d, 1000.0)
    assert signal.details["query"] == 'p999{model="$model"}'  # the trigger's, not the detail's
    assert "shadow" not in signal.details  # a live trigger's signal is never marked shadow by a detail
    assert signal.details["scale"] == 0.01 and signal.details["evidence"] == [[990.0, 0.9]]
    # The detection's own fields come first and a detector may still say its evidence in its details
    # (tail_excess: `evidence: histogram`), as journals have always held it.
    said = detection_signal(watch, Series({"version": "1"}, (), ()), Detection(
        "value_cusum", True, "fired", evidence=((990.0, 0.9),), details={"evidence": "histogram"}), 1000.0)
    assert said.details["evidence"] == "histogram"
    assert list(said.details)[:7] == ["reason", "baseline", "score", "threshold", "episode_start", "query",
                                      "evidence"]


def test_grid_detectors_say_why_nothing_was_decided() -> None:
    now = 1000.0
    stale = Series({"version": "1"}, tuple(float(t) for t in range(600, 800, 5)), tuple(1.0 for _ in range(600, 800, 5)))
    malformed = Series({"version": "2"}, (1.0, 2.0), (1.0,))
    threshold = ThresholdDetector({"threshold": 0.5})
    assert threshold.detect(stale, now).status is DetectorStatus.STALE
    assert threshold.detect(malformed, now).status is DetectorStatus.NO_DATA
    assert [d.status for d in threshold.detect_many([stale], now)] == [DetectorStatus.STALE]
    cusum = ValueCusumDetector({})
    assert cusum.detect(stale, now).status is DetectorStatus.STALE
    assert cusum.detect(Series({}, (), ()), now).status is DetectorStatus.NO_DATA
    fresh = Series({}, tuple(now - 5.0 * i for i in range(400, -1, -1)), tuple(1.0 + 0.01 * (i % 3) for i in range(401)))
    assert cusum.detect(fresh, now).status is DetectorStatus.OK


def test_tail_excess_verdicts_carry_the_batch_status() -> None:
    """tail_excess decides every row at once; each row's status reaches its Detection."""
    now = 2000.0
    t = np.arange(1000.0, 1701.0)  # the newest sample 300 s old: stale (30 s)
    counts = np.cumsum(np.full(t.size, 40.0))
    stale_bucket = Series({"version": "1", "le": "500"}, tuple(t), tuple(counts))
    stale_count = Series({"version": "1"}, tuple(t), tuple(counts))
    t2 = np.arange(1000.0, 2001.0)
    c2 = np.cumsum(np.full(t2.size, 40.0))
    ok_bucket = Series({"version": "2", "le": "500"}, tuple(t2), tuple(c2))
    ok_count = Series({"version": "2"}, tuple(t2), tuple(c2))
    det = TailExcessDetector({"line": 500, "evidence": "histogram"})
    stale, ok = det.detect_many([stale_bucket, ok_bucket], now, [stale_count, ok_count])
    assert stale.status is DetectorStatus.STALE and stale.reason.startswith("stale")
    assert ok.status is DetectorStatus.OK
    assert det.detect(ok_bucket, now, ok_count).status is DetectorStatus.OK
    assert det.detect(ok_bucket, now, None).status is DetectorStatus.NO_COUNTS
