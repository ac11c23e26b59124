"""Every test that starts a process is marked `integration` or `slow`, so that
`pytest -m "not integration and not slow"` is a quick unit run that starts none.

Loaded as a plugin by tests/conftest.py. While a test runs its setup, call or teardown, every
process start is noted against it: `subprocess.Popen` (which `subprocess.run`, `check_output` and
asyncio's subprocesses go through), `asyncio.create_subprocess_exec`/`_shell`, `multiprocessing`
process starts (a `ProcessPoolExecutor`'s workers), `os.system`, `os.posix_spawn`/`posix_spawnp`
and `os.fork`. A test that is not marked and started one fails, naming what it started.

Session- and module-scoped fixtures start during the setup of the first test that asks for them,
so a server fixture started on behalf of an unmarked test fails that test (a function-scoped
autouse fixture would not see them: pytest sets up wider scopes first). This is why the check sits
in the runtest hooks, not in a fixture.

The spawn is not refused, only noted: a refused start inside a session fixture would break it for
the marked tests after it too. Nested runs (pytester's in-process `runpytest`) each have their own
guard; only the innermost one notes, so the outer test is not blamed for its inner run's spawns.
"""
from __future__ import annotations

import asyncio
import asyncio.subprocess
import functools
import multiprocessing.process
import os
import subprocess
import threading
from collections.abc import Callable, Generator
from typing import Any

import pytest

MARKS = ("integration", "slow")
"""A test with either mark may start processes; the quick unit run deselects both."""


class SpawnGuard:
    """The processes started by the test now in a phase (setup, call, teardown) of this session."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.spawned: list[str] = []
        self._lock = threading.Lock()

    def note(self, what: str) -> None:
        with self._lock:
            if self.item is not None:
                self.spawned.append(what)

    def begin(self, item: pytest.Item) -> None:
        with self._lock:
            self.item, self.spawned = item, []

    def end(self) -> list[str]:
        with self._lock:
            spawned, self.item, self.spawned = self.spawned, None, []
        return spawned


_guards: list[SpawnGuard] = []  # one per running pytest session, innermost last
_originals: list[tuple[Any, str, Any]] = []
_guard_key = pytest.StashKey[SpawnGuard]()


def _note(what: str) -> None:
    if _guards:
        _guards[-1].note(what)


def _argv(args: Any) -> str:
    if isinstance(args, (str, bytes, os.PathLike)):
        return repr(os.fsdecode(args))
    try:
        return repr([os.fsdecode(a) for a in args][:6])
    except TypeError:
        return repr(args)


def _popen_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        _note(f"subprocess.Popen {_argv(args)}")
        original(self, args, *rest, **kwargs)
    return init


def _async_spawn(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def spawn(program: Any, *args: Any, **kwargs: Any) -> Any:
        _note(f"asyncio.{name} {_argv([program, *args]) if name.endswith('exec') else _argv(program)}")
        return await original(program, *args, **kwargs)
    return spawn


def _process_start(original: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(original)
    def start(self: multiprocessing.process.BaseProcess) -> None:
        _note(f"multiprocessing process {self.name}")
        original(self)
    return start


def _os_call(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        _note(f"os.{name} {_argv(args[0]) if args and name != 'fork' else ''}".rstrip())
        return original(*args, **kwargs)
    return call


def _install() -> None:
    targets: list[tuple[Any, str, Callable[[Any], Any]]] = [
        (subprocess.Popen, "__init__", _popen_init),
        (multiprocessing.process.BaseProcess, "start", _process_start),
    ]
    for module in (asyncio, asyncio.subprocess):
        for name in ("create_subprocess_exec", "create_subprocess_shell"):
            targets.append((module, name, functools.partial(_async_spawn, name)))
    for name in ("system", "posix_spawn", "posix_spawnp", "fork"):
        if hasattr(os, name):
            targets.append((os, name, functools.partial(_os_call, name)))
    for owner, name, wrap in targets:
        original = getattr(owner, name)
        _originals.append((owner, name, original))
        setattr(owner, name, wrap(original))


def _uninstall() -> None:
    while _originals:
        owner, name, original = _originals.pop()
        setattr(owner, name, original)


def pytest_configure(config: pytest.Config) -> None:
    if not _guards:
        _install()
    guard = SpawnGuard()
    config.stash[_guard_key] = guard
    _guards.append(guard)


def pytest_unconfigure(config: pytest.Config) -> None:
    guard = config.stash.get(_guard_key, None)
    if guard in _guards:
        _guards.remove(guard)
        if not _guards:
            _uninstall()


def _marked(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(mark) is not None for mark in MARKS)


def _guarded(item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
    guard = item.config.stash[_guard_key]
    guard.begin(item)
    try:
        result = yield
    finally:
        spawned = guard.end()
    if spawned and not _marked(item):
        started = "; ".join(dict.fromkeys(spawned))  # each once, in order
        pytest.fail(f"{item.nodeid} started a process in its {phase} but is not marked "
                    f"{' or '.join(MARKS)} (pytestmark = pytest.mark.integration; README.md, 'Run the tests'): "
                    f"{started}", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    return (yield from _guarded(item, "teardown"))
