"""Pytest fixtures: a started KubeEmulator on loopback and a real kubernetes_asyncio ApiClient for it.

Register with `pytest_plugins = ["tests.support.kube.conftest_plugin"]` in tests/conftest.py.
"""
from __future__ import annotations

from typing import AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient

from lab.kube.emulator import KubeEmulator


@pytest.fixture
async def kube_emulator() -> AsyncIterator[KubeEmulator]:
    """A fresh, empty emulator per test, served on 127.0.0.1 at a free port."""
    async with KubeEmulator() as emulator:
        yield emulator


@pytest.fixture
async def kube_api(kube_emulator: KubeEmulator) -> AsyncIterator[ApiClient]:
    """The real kubernetes_asyncio ApiClient pointed at `kube_emulator`, closed after the test."""
    client = ApiClient(configuration=kube_emulator.configuration())
    try:
        yield client
    finally:
        await client.close()
