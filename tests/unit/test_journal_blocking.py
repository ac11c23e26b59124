"""The journal's async face (daemon/storage/blocking.py): a `@blocking` repository method is called
as it is from a thread and awaited from the event loop in a worker thread, with the same arguments
and the same answer; overriding it in a subclass keeps both."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from daemon.storage.blocking import blocking
from daemon.storage.errors import JournalValueError
from daemon.storage.journal import Journal


class _Repo:
    def __init__(self, base: int) -> None:
        self.base = base
        self.threads: list[str] = []

    @blocking
    def add(self, n: int, *, twice: bool = False) -> int:
        """Adds."""
        self.threads.append(threading.current_thread().name)
        return (self.base + n) * (2 if twice else 1)


class _Doubled(_Repo):
    @blocking
    def add(self, n: int, *, twice: bool = False) -> int:
        return super().add(n, twice=twice) + _Repo.add(self, n, twice=twice)


def test_a_direct_call_runs_in_the_calling_thread():
    repo = _Repo(1)
    assert repo.add(2) == 3 and repo.add(2, twice=True) == 6
    assert repo.threads == [threading.current_thread().name] * 2


async def test_in_thread_runs_the_same_call_off_the_event_loop():
    repo = _Repo(1)
    assert await repo.add.in_thread(2, twice=True) == 6
    assert repo.threads != [threading.current_thread().name]


async def test_each_repository_has_its_own_bound_call():
    one, two = _Repo(1), _Repo(10)
    assert (one.add(1), two.add(1), await one.add.in_thread(1), await two.add.in_thread(1)) == (2, 11, 2, 11)
    assert one.add is one.add and one.add is not two.add  # made once per repository


async def test_an_override_reaches_the_parent_through_super_and_the_class():
    repo = _Doubled(1)
    assert repo.add(2) == 6 and await repo.add.in_thread(2) == 6
    assert _Repo(1).add(2) == 3  # the parent's own instances are untouched


def test_the_method_keeps_its_documentation():
    assert _Repo.add.__doc__ == "Adds."


async def test_a_journal_repository_answers_alike_both_ways(tmp_path: Path):
    journal = Journal(tmp_path / "j.db")
    try:
        journal.pins.record("ns/a", "a", 1)
        await journal.pins.record.in_thread("ns/b", "b", 2, reason="by hand")
        assert journal.pins.live() == await journal.pins.live.in_thread()
        assert [p.target for p in journal.pins.live()] == ["ns/a", "ns/b"]
        assert await journal.prune.in_thread(0.0) == journal.prune(0.0)
    finally:
        journal.close()


async def test_errors_come_back_to_the_awaiting_caller(tmp_path: Path):
    journal = Journal(tmp_path / "j.db")
    try:
        with pytest.raises(JournalValueError, match="target: not storable"):
            await journal.pins.record.in_thread("ns/\ud800", "a", 1)
    finally:
        journal.close()
