"""Free loopback TCP ports for the lab's local servers."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    The socket is closed before the caller binds, so another process could take the port in
    between; the window is tiny on a test machine and the servers fail loudly if it happens.

    Returns:
        The port number.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])
