"""Pytest fixtures that run the lab's real servers (Triton, Prometheus, Alertmanager).

Loaded as a plugin (``pytest_plugins = ["tests.support.lab_fixtures"]``). Every process a fixture starts
is stopped by that fixture, by PID, at teardown.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.alertmanager import AlertmanagerServer
from lab.prometheus import PrometheusServer
from lab.triton import TritonServer, served_versions, write_model_repository

RANKER = "ranker"
# v1 healthy, v2 sends 0.5% of requests down a 900 ms path: production after a bad deploy.
RANKER_SLOW_FRACTIONS = {1: 0.0, 2: 0.005}
RANKER_SERVED_VERSION = "2"

PrometheusFactory = Callable[..., Awaitable[PrometheusServer]]
AlertmanagerFactory = Callable[..., Awaitable[AlertmanagerServer]]
TritonFactory = Callable[..., Awaitable[TritonServer]]


@pytest.fixture(scope="session")
def triton_session_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One Triton for the whole run: starting it costs seconds on 2 cores.

    Sync on purpose: it is a separate process, so it needs no event loop, and a sync fixture
    can be session-scoped while async tests keep their function-scoped loops.
    """
    root = tmp_path_factory.mktemp("triton")
    write_model_repository(root / "models", name=RANKER, slow_fraction_by_version=RANKER_SLOW_FRACTIONS)
    server = TritonServer(root / "models", models=[RANKER], workdir=root)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _reload_from_disk(server: TritonServer, model: str) -> None:
    # A load without a config does not always undo an earlier config override (two overrides in
    # a row stick), so reset with an explicit override back to the default policy: latest version.
    with urllib.request.urlopen(f"{server.base_url}/v2/models/{model}/config", timeout=10) as response:
        config = json.load(response)
    config["version_policy"] = {"latest": {"num_versions": 1}}
    body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
    request = urllib.request.Request(f"{server.base_url}/v2/repository/models/{model}/load", data=body,
                                     method="POST")
    with urllib.request.urlopen(request, timeout=60):
        pass


@pytest.fixture
def triton_server(triton_session_server: TritonServer) -> TritonServer:
    """The shared Triton, with "ranker" serving v2 (slow path) only, as after a bad deploy.

    Tests may roll the model back; the next test gets it reset here (only when it changed, so
    the common case costs one index call, not a 1.5 s reload).
    """
    if served_versions(triton_session_server, RANKER) != [RANKER_SERVED_VERSION]:
        _reload_from_disk(triton_session_server, RANKER)
    return triton_session_server


@pytest.fixture
async def triton_factory(tmp_path: Path) -> AsyncIterator[TritonFactory]:
    """Start a private Triton with its own model repository: ``await triton_factory(**model_kwargs)``.

    Keyword arguments go to `write_model_repository` (e.g. ``slow_fraction_by_version``,
    ``slow_ms``, ``instances``); use it when a test needs a model unlike the shared one.
    """
    started: list[TritonServer] = []

    async def factory(**model_kwargs: Any) -> TritonServer:
        root = tmp_path / f"triton-{len(started)}"
        model_dir = write_model_repository(root / "models", **model_kwargs)
        server = TritonServer(root / "models", models=[model_dir.name], workdir=root)
        started.append(server)
        await asyncio.to_thread(server.start)
        return server

    try:
        yield factory
    finally:
        for server in reversed(started):
            await asyncio.to_thread(server.stop)


@pytest.fixture
async def prometheus_factory(tmp_path: Path) -> AsyncIterator[PrometheusFactory]:
    """Start Prometheus servers: ``await prometheus_factory(**PrometheusServer kwargs)``."""
    started: list[PrometheusServer] = []

    async def factory(**kwargs: Any) -> PrometheusServer:
        kwargs.setdefault("workdir", tmp_path / f"prometheus-{len(started)}")
        server = PrometheusServer(**kwargs)
        started.append(server)
        await asyncio.to_thread(server.start)
        return server

    try:
        yield factory
    finally:
        for server in reversed(started):
            await asyncio.to_thread(server.stop)


@pytest.fixture
async def alertmanager_factory(tmp_path: Path) -> AsyncIterator[AlertmanagerFactory]:
    """Start Alertmanagers: ``await alertmanager_factory(webhook_url, **AlertmanagerServer kwargs)``."""
    started: list[AlertmanagerServer] = []

    async def factory(webhook_url: str, **kwargs: Any) -> AlertmanagerServer:
        kwargs.setdefault("workdir", tmp_path / f"alertmanager-{len(started)}")
        server = AlertmanagerServer(webhook_url, **kwargs)
        started.append(server)
        await asyncio.to_thread(server.start)
        return server

    try:
        yield factory
    finally:
        for server in reversed(started):
            await asyncio.to_thread(server.stop)
