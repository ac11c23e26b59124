"""`tailguard run`: the daemon in the foreground until SIGINT or SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import signal as os_signal
import sys
from typing import TYPE_CHECKING

import structlog

from daemon.common.config import ConfigError, load_settings
from daemon.common.heap import freeze_startup_heap
from daemon.common.logs import configure_logging
from daemon.wiring.registries import action_registry, detector_registry

if TYPE_CHECKING:
    from daemon.common.config import Settings


def run(args: argparse.Namespace) -> int:
    """Exit 0 after a clean stop; 2 for bad settings; 1 for a journal that cannot be opened."""
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log.format, settings.log.level)
    from daemon.storage.errors import JournalError

    try:
        asyncio.run(_serve(settings))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except JournalError as exc:  # the journal cannot be opened (database unreachable, newer schema)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(settings: Settings) -> None:
    from daemon.wiring.service import Service

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (os_signal.SIGINT, os_signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    service = Service(settings, action_registry(), detector_registry())
    async with service:
        freeze_startup_heap()
        await stop.wait()
        structlog.get_logger("tailguard").info("shutting down")
