"""SIGTERM with a stalled client connected: the daemon exits within listen.shutdownTimeoutSeconds,
not after aiohttp's default 60 s or the body read timeout (the pod's grace period is 30 s)."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from lab.ports import free_port
from lab.process import ManagedProcess
from tests.support.helpers import TOKEN
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

SHUTDOWN_SECONDS = 2.0
BODY_READ_SECONDS = 120.0  # far longer than the bound under test: only the shutdown bound can end it


async def test_sigterm_with_a_stalled_body_exits_within_the_shutdown_bound(tmp_path: Path):
    """A client holds a half-sent webhook body open; SIGTERM still ends the daemon, cleanly and soon."""
    port = free_port()
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(
        "name: p\ntarget: {model: ranker}\ntriggers:\n  - alert: {name: TritonTailLatencyHigh}\n"
        "actions:\n  - {type: notify, url: 'http://127.0.0.1:9/'}\n"
        "verify: {query: 'vector(0)', below: 1, onNotRecovered: none}\n")  # required: alert-only
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "listen": {"host": "127.0.0.1", "port": port, "shutdownTimeoutSeconds": SHUTDOWN_SECONDS},
        "webhook": {"bodyReadTimeoutSeconds": BODY_READ_SECONDS},
        "policies": {"path": str(tmp_path / "policies")},
        "journal": {"path": str(tmp_path / "journal.db")},
        "log": {"format": "json"},
    }))
    daemon = ManagedProcess([sys.executable, "-m", "daemon.wiring.cli", "run", "--config", str(config)],
                            tmp_path / "daemon.log", cwd=REPO,
                            env={**os.environ, "TAILGUARD_WEBHOOK_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"})
    daemon.start()
    try:
        await asyncio.to_thread(daemon.wait_ready, f"http://127.0.0.1:{port}/readyz", 60.0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"vers")
        await writer.drain()
        await asyncio.sleep(0.5)  # the request is in the handler, waiting for the rest of its body
        started = time.monotonic()
        os.kill(daemon.pid, signal.SIGTERM)
        deadline = started + SHUTDOWN_SECONDS + 8.0  # the bound plus the rest of a clean stop
        while daemon.running and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - started
        assert not daemon.running, f"still running {elapsed:.1f}s after SIGTERM:\n{daemon.log_tail()}"
        assert daemon.stop() == 0, daemon.log_tail()
        writer.close()
    finally:
        daemon.stop()
