"""The journal is the queue of record: the service holds a bounded cache of its pending signals.

A burst larger than the cache is processed in full, each signal once; signals that match a policy
go ahead of those that match none; a backlog left in the journal is read back after a restart;
past the pending bound the webhook answers 503 + Retry-After and the alerts come in on retry."""
from __future__ import annotations

import asyncio
import collections
import copy
import json
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from core.signal import Signal
from daemon.http.intake import alert_signals, parse_payload
from daemon.common.metrics import Metrics
from daemon.storage.blocking import blocking
from daemon.storage.journal import Journal
from daemon.storage.records import StoredSignal
from daemon.storage.signals import Signals
from daemon.wiring.registries import action_registry, detector_registry
from daemon.wiring.service import Service
from daemon.workers.backlog import Backlog
from policies.loader import LoadedPolicy, load_policies_text
from tests.support.helpers import NotifySink, local_settings, post_alerts, sample_payload, wait_for

def _policy(url: str, model: str = "ranker") -> str:
    """A notify policy for TritonTailLatencyHigh on `model`, never held back by its guards (JSON is YAML)."""
    return json.dumps({"name": f"{model}-notify", "target": {"model": model},
                       "triggers": [{"alert": {"name": "TritonTailLatencyHigh"}}],
                       "actions": [{"type": "notify", "url": url}], "guards": {"cooldown": "0s", "maxActions": 100000},
                       # alert-only: a verify block is required; its outcome is irrelevant here
                       "verify": {"query": "vector(0)", "below": 1, "onNotRecovered": "none"}})


def _payload(first: int, models: list[str]) -> dict[str, Any]:
    """One webhook body with an alert per model, fingerprints first, first+1, ... (all distinct)."""
    body = copy.deepcopy(sample_payload())
    template = body["alerts"][0]
    body["alerts"] = []
    for n, model in enumerate(models):
        alert = copy.deepcopy(template)
        alert["labels"]["model"] = model
        alert["fingerprint"] = f"{first + n:016x}"
        body["alerts"].append(alert)
    return body


def _policies(tmp_path: Path, sink: NotifySink) -> Path:
    pol = tmp_path / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "p.yaml").write_text(_policy(sink.url))
    return pol


def _count_processing(svc: Service) -> collections.Counter[int]:
    """How many times the executor is given each signal id (shuffled by small random delays)."""
    calls: collections.Counter[int] = collections.Counter()
    process = svc.executor.process
    rng = random.Random(3)

    async def counted(signal_id: int, signal: Signal) -> Any:
        calls[signal_id] += 1
        await asyncio.sleep(rng.random() * 0.002)
        return await process(signal_id, signal)

    svc.backlog._process = counted
    return calls


async def _check_all_processed_once(svc: Service, calls: collections.Counter[int], sink: NotifySink) -> None:
    signals = await svc.journal.signals.all.in_thread()
    assert [s.id for s in signals if s.state != "processed"] == []
    matching = {s.id for s in signals if s.payload["labels"]["model"] == "ranker"}
    assert set(calls) == matching and set(calls.values()) == {1}  # only matching ones, each once
    decisions = await svc.journal.decisions.all.in_thread()
    assert sorted(d.signal_id for d in decisions) == sorted(matching)
    assert len(sink.received) == len(matching)
    assert await svc.journal.signals.pending_count.in_thread() == 0


@pytest.mark.slow
async def test_burst_larger_than_the_cache_is_processed_in_full_each_signal_once(tmp_path: Path,
                                                                                 sink: NotifySink):
    """40 concurrent webhooks of 10 alerts (a quarter match) through a cache of 4 per class: the
    overflow waits in the journal, is read back, and every signal is processed exactly once;
    the unmatched ones never reach the executor."""
    rng = random.Random(11)
    bodies = [_payload(10 * i, [rng.choice(["ranker", "other", "other", "other"]) for _ in range(10)])
              for i in range(40)]
    svc = Service(local_settings(tmp_path, _policies(tmp_path, sink), executor={"workers": 2, "queueSize": 4}),
                  action_registry(), detector_registry())
    calls = _count_processing(svc)
    async with svc:
        statuses = [r.status for r in await asyncio.gather(*(post_alerts(svc, b) for b in bodies))]
        assert statuses == [200] * len(bodies)
        await svc.drain()
        assert sum(svc.backlog._dropped) > 0, "the burst never overflowed the cache"
        await _check_all_processed_once(svc, calls, sink)
        assert len(await svc.journal.signals.all.in_thread()) == 400


async def test_matching_signal_goes_ahead_of_unmatched_ones(tmp_path: Path, sink: NotifySink):
    """With 60 unmatched signals waiting (and their marking held up), a matching one that comes
    after them is acted on at once; then the rest is marked processed."""
    async with Service(local_settings(tmp_path, _policies(tmp_path, sink), executor={"workers": 2, "queueSize": 8}),
                       action_registry(), detector_registry()) as svc:
        (marker,) = [t for t in svc.supervisor.tasks if t.get_name() == "backlog-unmatched"]
        marker.cancel()
        for i in range(6):
            assert (await post_alerts(svc, _payload(10 * i, ["other"] * 10))).status == 200
        assert (await post_alerts(svc, _payload(1000, ["ranker"]))).status == 200
        await wait_for(lambda: len(sink.received) == 1, timeout=10)
        # The action's notice goes out just before its signal is marked processed: wait (bounded) for
        # the mark, then the 60 unmatched ones are still all that is pending.
        for _ in range(100):
            if await svc.journal.signals.pending_count.in_thread() <= 60:
                break
            await asyncio.sleep(0.05)
        assert await svc.journal.signals.pending_count.in_thread() == 60
        svc.supervisor.spawn("backlog-unmatched", svc.backlog.mark_unmatched())
        await svc.drain()
        assert await svc.journal.signals.pending_count.in_thread() == 0
        assert len(await svc.journal.decisions.all.in_thread()) == 1


async def test_backlog_left_in_the_journal_is_read_back_after_a_restart(tmp_path: Path, sink: NotifySink):
    """Signals journaled (acknowledged) but not processed before a restart, more than the cache
    holds, are all processed once by the next start."""
    settings = local_settings(tmp_path, _policies(tmp_path, sink), executor={"workers": 2, "queueSize": 3})
    journal = Journal(settings.journal.path)
    models = ["ranker" if i % 3 == 0 else "other" for i in range(45)]
    journal.signals.record(alert_signals(parse_payload(_payload(0, models))))
    journal.close()
    svc = Service(settings, action_registry(), detector_registry())
    calls = _count_processing(svc)
    async with svc:
        await svc.drain()
        await _check_all_processed_once(svc, calls, sink)
        assert len(calls) == 15


async def test_past_the_pending_bound_the_webhook_answers_503_and_the_retry_is_taken(tmp_path: Path,
                                                                                   sink: NotifySink):
    """Nothing processes (workers stopped, as in a stall): past max_pending the webhook answers
    503 with Retry-After and journals nothing; after a restart the backlog is processed and the
    same alerts sent again are accepted."""
    settings = local_settings(tmp_path, _policies(tmp_path, sink),
                              journal={"path": str(tmp_path / "journal.db"), "maxPending": 5})
    async with Service(settings, action_registry(), detector_registry()) as svc:
        for task in svc.supervisor.tasks:
            if task.get_name().startswith("worker-") or task.get_name() == "backlog-unmatched":
                task.cancel()
        assert (await post_alerts(svc, _payload(0, ["ranker"] * 3 + ["other"] * 2))).status == 200
        refused = await post_alerts(svc, _payload(100, ["ranker", "other"]))
        assert refused.status == 503 and refused.headers["Retry-After"]
        assert await svc.journal.signals.pending_count.in_thread() == 5
    async with Service(settings, action_registry(), detector_registry()) as svc:
        await svc.drain()
        assert len(sink.received) == 3
        assert (await post_alerts(svc, _payload(100, ["ranker", "other"]))).status == 200
        await svc.drain()
        assert len(sink.received) == 4
        assert len(await svc.journal.signals.all.in_thread()) == 7
        assert await svc.journal.signals.pending_count.in_thread() == 0


class _CountedReads(Signals):
    """Counts the rows reads of the pending set return; with `delay`, they come back late
    (workers finish signals in between)."""

    delay = 0.0
    rows_read = 0
    _count_lock = threading.Lock()

    @blocking
    def pending(self, limit: int | None = None, after_id: int = 0) -> list[StoredSignal]:
        rows = super().pending(limit, after_id)
        with self._count_lock:
            self.rows_read += len(rows)
        time.sleep(self.delay)
        return rows


class _Harness:
    """A Backlog on a real journal with a fake executor that counts what it is given."""

    def __init__(self, tmp_path: Path, capacity: int) -> None:
        self.journal = Journal(tmp_path / "j.db")
        self.reads = self.journal.signals = _CountedReads(self.journal, self.journal.signals.max_pending)
        self.policies = self.load("ranker")
        self.calls: collections.Counter[int] = collections.Counter()
        self.metrics = Metrics()
        self.backlog = Backlog(self.journal, lambda: self.policies, self._process, self.metrics, capacity=capacity,
                               page=7)
        self.tasks: list[asyncio.Task[None]] = []

    @staticmethod
    def load(model: str) -> list[LoadedPolicy]:
        return list(load_policies_text(_policy("http://127.0.0.1:9/hook", model), "p.yaml", action_registry(),
                                       detector_registry()).policies)

    async def _process(self, signal_id: int, signal: Signal) -> None:
        self.calls[signal_id] += 1
        await asyncio.sleep(0.001)
        await self.journal.signals.mark_processed.in_thread([signal_id])

    def start(self, workers: int = 3, marker: bool = True) -> None:
        self.journal.signals.on_intake(self.backlog.admit)
        self.tasks += [asyncio.create_task(self.backlog.work()) for _ in range(workers)]
        self.tasks.append(asyncio.create_task(self.backlog.refill()))
        if marker:
            self.tasks.append(asyncio.create_task(self.backlog.mark_unmatched(batch=3)))

    async def record(self, first: int, models: list[str]) -> None:
        await self.journal.signals.intake(alert_signals(parse_payload(_payload(first, models))))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.journal.signals.on_intake(None)
        self.journal.close()


@pytest.mark.slow
async def test_a_signal_finished_while_the_journal_is_read_is_not_taken_again(tmp_path: Path):
    """The refill read sees a signal pending that a worker finishes before the read comes back:
    it must not be taken a second time. Concurrent callers, a cache of 2, 300 signals."""
    h = _Harness(tmp_path, capacity=2)
    h.reads.delay = 0.005
    h.start()
    try:
        await asyncio.gather(*(h.record(10 * i, ["ranker"] * 10) for i in range(30)))
        await asyncio.wait_for(h.backlog.drain(), timeout=30)
        assert len(h.calls) == 300 and set(h.calls.values()) == {1}
        assert await h.journal.signals.pending_count.in_thread() == 0
    finally:
        await h.close()


async def test_unmatched_signals_flow_while_matching_ones_are_stuck(tmp_path: Path):
    """No worker runs: 200 matching signals stay pending. Unmatched ones arriving behind them are
    still marked processed, and each read starts where the last one of its class stopped (the
    stuck matching rows are not read again for every batch of unmatched ones)."""
    h = _Harness(tmp_path, capacity=4)
    h.start(workers=0)
    try:
        for i in range(20):
            await h.record(10 * i, ["ranker"] * 10)
        for i in range(20, 40):
            await h.record(10 * i, ["other"] * 10)
        await wait_for(lambda: h.journal.signals.pending_count() == 200, timeout=10)
        assert h.reads.rows_read < 3 * 400, h.reads.rows_read
    finally:
        await h.close()


async def test_a_policy_change_moves_pending_signals_to_the_executor(tmp_path: Path):
    """Signals left in the journal while they matched no policy are read again when a new policy
    set makes them match, and go through the executor; those already held are simply marked."""
    h = _Harness(tmp_path, capacity=2)
    h.start(marker=False)
    try:
        await h.record(0, ["other"] * 5)
        await wait_for(lambda: not h.backlog._reading and h.backlog._overflow[1], timeout=10)
        h.policies = h.load("other")
        h.backlog.policies_changed()
        h.tasks.append(asyncio.create_task(h.backlog.mark_unmatched(batch=3)))
        await asyncio.wait_for(h.backlog.drain(), timeout=10)
        assert sorted(h.calls) == [3, 4, 5] and set(h.calls.values()) == {1}
        assert await h.journal.signals.pending_count.in_thread() == 0
    finally:
        await h.close()


@pytest.mark.slow
async def test_a_pending_row_this_version_cannot_read_is_left_pending_and_the_rest_flows(tmp_path: Path):
    """Two journaled rows spoiled on disk: one with no source (its class cannot be told), one that
    matches a policy but whose time cannot be read (its Signal cannot be built). Both stay pending,
    each counted once as a journal fault; the signals around them are processed or marked."""
    h = _Harness(tmp_path, capacity=4)
    await h.record(0, ["ranker", "other", "ranker", "other", "ranker"])  # ids 1-5
    first = await h.journal.signals.get.in_thread(1)
    assert first is not None
    spoiled = first.payload
    db = sqlite3.connect(tmp_path / "j.db")
    with db:
        db.execute("UPDATE signals SET payload=? WHERE id=1", (json.dumps(spoiled | {"observed_at": "soon"}),))
        db.execute("UPDATE signals SET payload=? WHERE id=2", (json.dumps({"name": "TritonTailLatencyHigh"}),))
    db.close()
    h.start()
    try:
        await wait_for(lambda: h.journal.signals.pending_count() == 2 and not h.backlog._reading, timeout=10)
        await asyncio.wait_for(h.backlog.drain(), timeout=10)
        assert sorted(h.calls) == [3, 5]
        assert [s.id for s in await h.journal.signals.pending.in_thread()] == [1, 2]
        assert h.metrics.registry.get_sample_value("tailguard_faults_total", {"component": "journal"}) == 2
    finally:
        await h.close()
