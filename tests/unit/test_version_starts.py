"""Version starts survive a restart (daemon/storage/starts.py, the poller's hand-over): the poller
journals the starts tail_excess finds and hands them back to a new detector before its first cycle,
so a restarted daemon resumes a version's start test from the same start and never starts a second
one; a version serving when the daemon starts, with nothing journaled, gets none."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.query import Series
from core.signal import Signal
from daemon.common.metrics import Metrics
from daemon.sources.prometheus import RangeResult
from daemon.storage.journal import Journal
from daemon.wiring.registries import action_registry, detector_registry
from daemon.workers.poller import Poller
from policies.loader import load_policies_text
from tests.unit.test_tail_excess_start import _cut, _version

POLICY = """
name: ranker-start
target: {model: ranker}
triggers:
  - detector:
      type: tail_excess
      query: 'bucket{model="$model", le="500"}'
      companionQuery: 'count{model="$model"}'
      interval: 5s
      params: {line: 500, evidence: histogram}
actions:
  - type: notify
    url: http://127.0.0.1:9/hook
guards: {cooldown: 0s}
verify: {query: 'vector(0)', below: 1, onNotRecovered: none}
"""


class _Prometheus:
    """Answers the trigger's two queries from prepared series, cut to the asked range."""

    def __init__(self, versions: list[tuple[Series, Series]]) -> None:
        self.versions = versions

    async def query_range(self, query: str, start: float, end: float, step: float) -> RangeResult:
        which = 0 if query.startswith("bucket") else 1
        out = []
        for pair in self.versions:
            s = _cut(pair[which], end, end - start)
            if s.timestamps:
                out.append(Series({**s.labels, "model": "ranker"}, s.timestamps, s.values))
        return RangeResult(query, out)


def _poller(journal: Journal, prom: _Prometheus, signals: list[Signal]) -> Poller:
    async def emit(signal: Signal) -> None:
        signals.append(signal)

    async def offload(*args: Any) -> Any:
        raise AssertionError("nothing to offload")

    poller = Poller(prom, journal, Metrics(), detector_registry(), emit, offload,  # type: ignore[arg-type]
                    incremental_range_queries=False)
    poller.sync(load_policies_text(POLICY, "test", action_registry(), detector_registry()))
    return poller


async def _cycle(poller: Poller, now: float) -> None:
    for group in list(poller.groups.values()):
        await poller.poll_group(group, now)


def _start_test(poller: Poller) -> dict[str, Any] | None:
    watch = next(w for g in poller.groups.values() for w in g.watches)
    assert watch.latest is not None
    labels, d = watch.latest.telling if watch.latest.telling else ({}, None)
    return None if d is None else d.details.get("start_test")


@pytest.fixture
def journal(tmp_path: Path):  # type: ignore[no-untyped-def]
    j = Journal(tmp_path / "journal.db")
    yield j
    j.close()


def test_the_first_start_journaled_wins(journal: Journal) -> None:
    assert journal.starts.record("default/ranker", "t1", {"2": 1001.0}) == 1
    assert journal.starts.record("default/ranker", "t1", {"2": 1201.0, "3": 1500.0}) == 1
    assert journal.starts.of("default/ranker", "t1") == {"2": 1001.0, "3": 1500.0}
    assert journal.starts.of("default/ranker", "t2") == {}
    with pytest.raises(ValueError, match="not a time"):
        journal.starts.record("default/ranker", "t1", {"4": float("nan")})


async def test_a_restart_resumes_the_start_test_from_the_journaled_start(journal: Journal) -> None:
    v1 = _version("1", 0, 1300, 40.0, 0.0005, 1)
    v2 = _version("2", 1000, 1300, 40.0, 0.0005, 2)
    prom = _Prometheus([v1, v2])
    signals: list[Signal] = []
    first = _poller(journal, prom, signals)
    await _cycle(first, 950.0)  # v1 alone: serving when the daemon starts
    await _cycle(first, 1010.0)  # v2's first requests: its start, journaled
    watch = next(w for g in first.groups.values() for w in g.watches)
    assert journal.starts.of("default/ranker", watch.fingerprint) == {"2": 1001.0}
    # A restart: a new poller (new detectors) on the same journal, v2 now serving for two minutes.
    again = _poller(journal, prom, signals)
    await _cycle(again, 1120.0)
    detector = next(w for g in again.groups.values() for w in g.watches).detector
    assert detector._starts is not None and detector._starts.starts == {"2": 1001.0}  # type: ignore[attr-defined]
    assert journal.starts.of("default/ranker", watch.fingerprint) == {"2": 1001.0}  # nothing new journaled
    # What `tailguard status` shows of the trigger: the start test's assumptions beside the bank's.
    assumed = again.telling()[("ranker-start", 0)]["assumed"]
    assert assumed["start_test"]["alpha_per_deploy"] == 0.001 and assumed["start_test"]["settle_seconds"] == 5.0
    assert assumed["bank_false_alarm_days"] == pytest.approx(30.0 / 0.97)
    # Without the journal the same restart gives v2 no start test (it was serving at the start).
    cold = _poller(Journal(":memory:"), prom, signals)
    await _cycle(cold, 1120.0)
    cold_detector = next(w for g in cold.groups.values() for w in g.watches).detector
    assert cold_detector._starts is not None and cold_detector._starts.starts == {}  # type: ignore[attr-defined]
    assert not signals


def test_prune_forgets_old_starts(journal: Journal) -> None:
    journal.starts.record("default/ranker", "t1", {"2": 1001.0})
    journal.prune(journal.clock() + 1.0)
    assert journal.starts.of("default/ranker", "t1") == {}
