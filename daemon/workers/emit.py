"""The one signature by which the poller and the scheduler hand signals to the service."""
from __future__ import annotations

from typing import Awaitable, Callable

from core.signal import Signal

# Journal a detector or schedule signal, then queue it; duplicates are dropped by the journal.
Emit = Callable[[Signal], Awaitable[None]]
