"""Start a server subprocess, wait until it answers over HTTP, and stop it by PID.

Only processes started here are ever signalled: `ManagedProcess` keeps the `Popen` it made and
never looks processes up by name.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

# Long enough for Triton to load a Python-backend model on 2 busy cores, short enough that a
# broken start fails a test run quickly.
DEFAULT_READY_TIMEOUT_SECONDS = 60.0
_POLL_INTERVAL_SECONDS = 0.1
_PROBE_TIMEOUT_SECONDS = 1.0


class ProcessStartError(RuntimeError):
    """The subprocess exited or never became ready; the message carries its log tail."""


@dataclass
class ManagedProcess:
    """A subprocess this lab started, its log file, and how to tell that it is ready."""

    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    _popen: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int:
        """The PID of the running process; raises if it was never started."""
        if self._popen is None:
            raise RuntimeError("process not started")
        return self._popen.pid

    @property
    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> None:
        """Start the process with stdout and stderr appended to `log_path`."""
        if self._popen is not None:
            raise RuntimeError("process already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # The child inherits its own copy of the descriptor, so closing ours is safe.
            # A new session keeps a Ctrl-C meant for pytest from reaching the server half-way
            # through a test; stop() still ends it.
            self._popen = subprocess.Popen(
                list(self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                start_new_session=True,
            )

    def wait_ready(
        self, url: str, timeout_seconds: float = DEFAULT_READY_TIMEOUT_SECONDS
    ) -> None:
        """Block until GET `url` answers 200, the process exits, or the deadline passes.

        Args:
            url: A readiness URL on loopback, e.g. ``http://127.0.0.1:8000/v2/health/ready``.
            timeout_seconds: How long to wait at most.

        Raises:
            ProcessStartError: the process exited or did not become ready in time.
        """
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if not self.running:
                raise ProcessStartError(
                    f"{self.argv[0]} exited with {self._exit_code()} before ready:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=_PROBE_TIMEOUT_SECONDS) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                # Not listening yet, or listening but not ready (non-2xx): keep polling.
                pass
            time.sleep(_POLL_INTERVAL_SECONDS)
        raise ProcessStartError(
            f"{self.argv[0]} not ready at {url} after {timeout_seconds}s:\n{self.log_tail()}"
        )

    def stop(self, grace_seconds: float = 10.0) -> int | None:
        """Terminate the process, wait up to `grace_seconds`, then kill it.

        Idempotent: stopping a process that already exited (or never started) is a no-op.

        Returns:
            The exit code, or None if the process was never started.
        """
        if self._popen is None:
            return None
        if self._popen.poll() is None:
            self._popen.terminate()
            try:
                self._popen.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                # It ignored SIGTERM; SIGKILL cannot be ignored, and it is our own child.
                self._popen.kill()
                self._popen.wait(timeout=grace_seconds)
        return self._popen.returncode

    def stop_group(self, grace_seconds: float = 10.0) -> int | None:
        """`stop`, then SIGKILL what is left of the process group this process leads (it starts
        with `start_new_session`): helpers it started and left behind on an abrupt exit, such as
        Triton's Python-backend stubs when it is stopped with requests in flight. The group is
        signalled before the leader is reaped, so its id cannot have passed to another process.

        Returns:
            The exit code, or None if the process was never started.
        """
        if self._popen is None or self._popen.returncode is not None:
            return self.stop(grace_seconds)  # never started, or reaped already: its group id is not ours now
        pid = self._popen.pid
        if not _exited_unreaped(pid, 0.0):
            os.kill(pid, signal.SIGTERM)
            if not _exited_unreaped(pid, grace_seconds):
                os.kill(pid, signal.SIGKILL)  # our own child ignored SIGTERM
                _exited_unreaped(pid, grace_seconds)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # nothing else in the group: the usual clean exit
        return self._popen.wait(timeout=grace_seconds)

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The last `max_bytes` of the log, for error messages."""
        try:
            size = self.log_path.stat().st_size
            with open(self.log_path, "rb") as log:
                log.seek(max(0, size - max_bytes))
                return log.read().decode("utf-8", errors="replace")
        except OSError:
            return "<no log>"

    def _exit_code(self) -> int | None:
        return None if self._popen is None else self._popen.poll()


def _exited_unreaped(pid: int, timeout_seconds: float) -> bool:
    """Whether our child `pid` exited within `timeout_seconds`, leaving it unreaped (a zombie keeps
    its pid and process group id from being reused)."""
    deadline = time.monotonic() + timeout_seconds
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_INTERVAL_SECONDS)
    return True


def environ_with(**overrides: str) -> dict[str, str]:
    """A copy of this process's environment with `overrides` applied."""
    env = dict(os.environ)
    env.update(overrides)
    return env


class LocalServer:
    """Plumbing shared by the lab's servers: one managed process, launch-until-ready, stop, pid,
    log tail and the context managers. Subclasses define `start` (write config, call `_launch`).

    Starting blocks for seconds (a subprocess and a readiness loop), so the async form runs it
    in a thread and the event loop keeps serving, e.g. a webhook receiver the server will call.
    """

    NAME = "server"
    STOP_GRACE_SECONDS = 10.0
    _process: ManagedProcess | None = None

    def start(self) -> None:
        raise NotImplementedError

    def _launch(self, argv: Sequence[str], log_path: Path, ready_url: str, timeout_seconds: float,
                env: Mapping[str, str] | None = None) -> None:
        """Start the process and block until `ready_url` answers; on failure, stop it again."""
        self._not_started()
        self._process = ManagedProcess(argv=argv, log_path=log_path, env=env)
        self._process.start()
        try:
            self._process.wait_ready(ready_url, timeout_seconds)
        except BaseException:
            self._process.stop()
            raise

    def _not_started(self) -> None:
        if self._process is not None:
            raise RuntimeError(f"{self.NAME} already started")

    def stop(self) -> int | None:
        """Stop the server (terminate, wait, kill); returns its exit code."""
        return self._process.stop(grace_seconds=self.STOP_GRACE_SECONDS) if self._process else None

    def restart(self) -> int | None:
        """Stop the server by PID and start it again on the same ports and folders (a crash and
        reschedule: Triton's counters start from zero, Prometheus replays its WAL); returns the
        old process's exit code."""
        # The whole group: a Triton stopped with requests in flight leaves its stubs behind otherwise.
        code = self._process.stop_group(self.STOP_GRACE_SECONDS) if self._process else None
        self._process = None  # the stopped process is done with; `start` launches a new one
        self.start()
        return code

    @property
    def pid(self) -> int:
        """PID of the running server."""
        if self._process is None:
            raise RuntimeError(f"{self.NAME} not started")
        return self._process.pid

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the server log, for assertion messages."""
        return self._process.log_tail(max_bytes) if self._process else ""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)
