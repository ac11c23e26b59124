"""Shared fixtures: real local servers (lab), the Kubernetes API emulator, a notify sink, a leak check,
and the check that every test starting a process is marked (tests/support/spawn_guard.py)."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import numpy.testing  # noqa: F401  (runs `lscpu` when first imported: here, not inside a unit test)
import pytest

from tests.support.helpers import NotifySink

pytest_plugins = ["tests.support.lab_fixtures", "tests.support.kube.conftest_plugin",
                  "tests.support.postgres", "tests.support.journal_backends",
                  "tests.support.spawn_guard"]


@pytest.fixture(autouse=True)
async def no_leftover_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail any async test that leaves asyncio tasks running behind it (a leaked poller, worker...)."""
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0)  # let tasks that were just cancelled finish
    left = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    if left:
        for t in left:
            t.cancel()
        pytest.fail(f"test left {len(left)} asyncio task(s) running: {[t.get_name() for t in left]}")


@pytest.fixture
async def sink() -> AsyncIterator[NotifySink]:
    """A loopback endpoint that records what the `notify` action posts (`sink.url`, `sink.received`)."""
    async with NotifySink() as s:
        yield s
