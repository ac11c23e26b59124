"""Free loopback TCP ports for the lab's local servers."""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack
from pathlib import Path

LOOPBACK = "127.0.0.1"

# Listening ports come from below the kernel's ephemeral range: a port from bind(0) is one an
# outgoing connection (a load generator opens hundreds) can take as its source port between our
# choosing it and the server binding it, as happened on CI when two demos started at once.
_LOWEST = 10_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_ATTEMPTS = 200


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    The socket is closed before the caller binds, so another listener could still take the port
    in between (our own, choosing at random from the same range); the servers fail loudly then.

    Returns:
        The port number.
    """
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports below the ephemeral range: each socket stays bound until all are
    chosen, so one server's two ports (Triton's API and metrics) are never the same number."""
    low, high = _LOWEST, _ephemeral_low()
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            ports.append(_bind_one(sock, low, high))
        return ports


def _bind_one(sock: socket.socket, low: int, high: int) -> int:
    """Bind `sock` to a random free port in [low, high), or where the kernel puts it when that
    range is empty or full."""
    for _ in range(_ATTEMPTS if high > low else 0):
        try:
            sock.bind((LOOPBACK, random.randrange(low, high)))
        except OSError:
            continue
        return int(sock.getsockname()[1])
    sock.bind((LOOPBACK, 0))
    return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port the kernel hands out for outgoing connections (32768 when unreadable)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768
