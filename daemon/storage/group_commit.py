"""Group commit: one writer thread hands every batch waiting to one write (one transaction, one
fsync), then answers each caller with its own result. Used by the signal intake."""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Generic, Sequence, TypeVar

from daemon.storage.errors import JournalError

B = TypeVar("B")
R = TypeVar("R")


class GroupCommit(Generic[B, R]):
    """Group commit: one writer thread takes every batch waiting and hands them all to `write`
    (one transaction, one fsync), then completes each caller's future with its own result.

    `write` returns one result per batch, in order, an exception for a caller that failed alone;
    if it raises, every caller of the group gets that exception. Nothing completes before `write`
    has returned, so no caller hears back before its rows are committed. The storage backend
    supplies `write`; the batching is the same for any backend (SQLite here, PostgreSQL likewise).
    """

    def __init__(self, write: Callable[[list[B]], Sequence[R | Exception]], name: str,
                 max_group: int = 512) -> None:
        self._write = write
        self._name = name
        self._max_group = max_group
        self._cond = threading.Condition()
        self._waiting: list[tuple[B, Future[R]]] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, batch: B) -> Future[R]:
        fut: Future[R] = Future()
        with self._cond:
            if self._closed:
                fut.set_exception(JournalError("journal closed"))
                return fut
            self._waiting.append((batch, fut))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return fut

    def close(self) -> None:
        """Write what is waiting, then stop the writer; later submits fail with JournalError."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                taken = self._waiting[:self._max_group]
                del self._waiting[:self._max_group]
            # A caller cancelled before its turn is not written at all.
            group = [(batch, fut) for batch, fut in taken if fut.set_running_or_notify_cancel()]
            if not group:
                continue
            try:
                results = self._write([batch for batch, _ in group])
            except BaseException as exc:  # handed to every caller of the group
                results = [exc if isinstance(exc, Exception) else JournalError(f"journal writer: {exc!r}")] * len(group)
            for (_, fut), result in zip(group, results):
                if isinstance(result, Exception):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
