"""The lab's listening ports: distinct, free, and outside the range the kernel gives outgoing
connections (where a load generator's source port could take one before its server binds it)."""
from __future__ import annotations

import socket

from lab import ports
from lab.ports import LOOPBACK, free_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    chosen = free_ports(8)
    assert len(set(chosen)) == 8
    low = ports._ephemeral_low()
    assert all(ports._LOWEST <= p < low for p in chosen), (chosen, low)
    for port in chosen:  # each is free once chosen: a server can bind it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, port))


def test_a_taken_port_is_never_chosen(monkeypatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((LOOPBACK, 0))
        taken = held.getsockname()[1]
        held.listen()
        # A range of one taken port: the chooser falls back to the kernel rather than return it.
        monkeypatch.setattr(ports, "_LOWEST", taken)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: taken + 1)
        (port,) = free_ports(1)
    assert port != taken
