"""Group commit: concurrent signal intake calls share one fsync'd transaction, each caller gets
exactly the result it would get alone, and none hears back before its rows are committed."""
from __future__ import annotations

import asyncio
import random
import time
from datetime import datetime, timezone
from typing import AsyncIterator, Iterator

import pytest

from core.signal import Signal, SignalSource
from daemon.storage.errors import JournalBackpressure, JournalError, JournalValueError
from daemon.storage.journal import Journal
from daemon.storage.records import SignalsRecorded
from tests.support.journal_backends import OpenJournal


def _signal(key: str, name: str = "A") -> Signal:
    return Signal(SignalSource.ALERT, name, {"model": "m"}, datetime.now(timezone.utc), key)


@pytest.fixture
async def journal(open_journal: OpenJournal) -> AsyncIterator[Journal]:
    """The journal on each backend (open_journal closes it)."""
    yield open_journal()


class _Plug:
    """Holds the writer inside one transaction (a first caller waits on the journal lock) so that
    the callers submitted meanwhile are all waiting when it lets go: they form the next group."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def __enter__(self) -> "_Plug":
        self.journal._lock.acquire()
        self.first = self.journal.signals.submit([_signal("plug")])
        deadline = time.monotonic() + 5
        while not self.first.running():  # the writer took it and waits for the lock
            assert time.monotonic() < deadline, "the writer never took the first batch"
            time.sleep(0.001)
        return self

    def __exit__(self, *exc: object) -> None:
        self.journal._lock.release()


@pytest.fixture
def rng() -> Iterator[random.Random]:
    yield random.Random(7)


async def test_many_concurrent_callers_share_transactions_and_get_their_own_results(
        journal: Journal, rng: random.Random):
    """300 callers of 1-10 signals drawn from 400 keys (so callers overlap): every key is stored
    once, each caller's new ids are its own keys' rows, duplicates add up, fewer commits than callers."""
    batches = [[f"k{rng.randrange(400)}" for _ in range(rng.randint(1, 10))] for _ in range(300)]
    commits = journal.commits
    results: list[SignalsRecorded] = await asyncio.gather(
        *(journal.signals.intake([_signal(k) for k in keys]) for keys in batches))
    transactions = journal.commits - commits

    rows = {s.dedup_key: s.id for s in await journal.signals.all.in_thread()}
    assert set(rows) == {k for keys in batches for k in keys}
    new_ids = [i for new, _ in results for i, _ in new]
    assert sorted(new_ids) == sorted(rows.values())  # each row reported new to exactly one caller
    for keys, (new, dup) in zip(batches, results):
        assert all(rows[s.dedup_key] == i for i, s in new)
        assert len(new) + dup == len(keys)
    assert sum(dup for _, dup in results) == sum(map(len, batches)) - len(rows)
    assert 1 <= transactions < len(batches), transactions
    assert journal.signals.pending_count() == len(rows)


async def test_duplicates_across_two_callers_in_one_group(journal: Journal):
    """Two callers committed in the same transaction with an overlapping key: the one submitted
    first inserts it, the other counts it a duplicate, exactly as if they had run one after the other."""
    with _Plug(journal) as plug:
        a = asyncio.ensure_future(journal.signals.intake([_signal("shared"), _signal("a")]))
        b = asyncio.ensure_future(journal.signals.intake([_signal("b"), _signal("shared"), _signal("b")]))
        await asyncio.sleep(0.05)
        assert not a.done() and not b.done()  # nobody hears back before the commit
        commits = journal.commits
    (new_a, dup_a), (new_b, dup_b) = await a, await b
    await asyncio.wrap_future(plug.first)
    assert journal.commits - commits == 2  # the plug's transaction, then one for a and b
    assert [s.dedup_key for _, s in new_a] == ["shared", "a"] and dup_a == 0
    assert [s.dedup_key for _, s in new_b] == ["b"] and dup_b == 2
    assert [s.dedup_key for s in await journal.signals.all.in_thread()] == ["plug", "shared", "a", "b"]


async def test_a_bad_caller_fails_alone_in_its_group(journal: Journal):
    """Unstorable text in one caller's batch fails that caller (naming the field) and writes none
    of its signals; the others of the same transaction are committed."""
    with _Plug(journal):
        good = asyncio.ensure_future(journal.signals.intake([_signal("g1")]))
        bad = asyncio.ensure_future(journal.signals.intake([_signal("b1"), _signal("b2", name="\ud800")]))
        also_good = asyncio.ensure_future(journal.signals.intake([_signal("g2")]))
        await asyncio.sleep(0.05)
    assert len((await good)[0]) == 1 and len((await also_good)[0]) == 1
    with pytest.raises(JournalValueError, match="signal 1 name"):
        await bad
    assert [s.dedup_key for s in await journal.signals.all.in_thread()] == ["plug", "g1", "g2"]
    assert len((await journal.signals.intake([_signal("after")]))[0]) == 1


async def test_a_caller_cancelled_before_its_turn_is_not_written(journal: Journal):
    with _Plug(journal):
        gone = asyncio.ensure_future(journal.signals.intake([_signal("gone")]))
        kept = asyncio.ensure_future(journal.signals.intake([_signal("kept")]))
        await asyncio.sleep(0.05)
        gone.cancel()
        await asyncio.sleep(0.05)  # the cancellation reaches the writer's queue
    assert len((await kept)[0]) == 1
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert [s.dedup_key for s in await journal.signals.all.in_thread()] == ["plug", "kept"]


async def test_listener_hears_of_new_signals_before_the_caller_returns(journal: Journal):
    heard: list[list[str]] = []
    journal.signals.on_intake(lambda new: heard.append([s.dedup_key for _, s in new]))
    new, dup = await journal.signals.intake([_signal("x"), _signal("y")])
    assert heard == [["x", "y"]]
    await journal.signals.intake([_signal("x")])  # nothing new: nothing heard
    assert heard == [["x", "y"]]
    journal.signals.on_intake(None)


async def test_backpressure_past_the_pending_bound(open_journal: OpenJournal):
    """Past max_pending, callers get JournalBackpressure (a JournalError: the webhook answers 503)
    and nothing is written; once signals are processed, they are taken again."""
    journal = open_journal(max_pending=3)
    try:
        new, _ = await journal.signals.intake([_signal(f"k{i}") for i in range(3)])
        with pytest.raises(JournalBackpressure, match="3 signals pending"):
            await journal.signals.intake([_signal("late")])
        assert issubclass(JournalBackpressure, JournalError)
        assert await journal.signals.pending_count.in_thread() == 3
        assert await journal.signals.mark_processed.in_thread([i for i, _ in new[:2]]) == 2
        assert len((await journal.signals.intake([_signal("late")]))[0]) == 1
    finally:
        journal.close()


async def test_closed_journal_refuses_new_callers(open_journal: OpenJournal):
    journal = open_journal()
    await journal.signals.intake([_signal("x")])
    journal.close()
    with pytest.raises(JournalError, match="closed"):
        await journal.signals.intake([_signal("y")])
